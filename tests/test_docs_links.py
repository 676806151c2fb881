"""Every relative link in README.md and docs/*.md names a file that exists, and where it names
a heading of a Markdown file, that heading is there (GitHub's anchors)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Pages another branch adds: a link to one may wait for its merge. Drop an entry once merged.
PENDING: set[str] = set()  # pages another branch is adding (a link to them passes until then)

_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_CODE = re.compile(r"`[^`\n]*`")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def _links(text: str) -> list[str]:
    text = _CODE.sub("", _FENCE.sub("", text))
    return [m.group(1) for m in _LINK.finditer(text)]


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its label
    text = re.sub(r"[^\w\- ]", "", text.replace("`", "").lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in _HEADING.findall(_FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = _anchor(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def _broken(page: Path, root: Path = ROOT) -> list[str]:
    bad = []
    for target in _links(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, mailto: ...
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        name = dest.relative_to(root).as_posix() if dest.is_relative_to(root) else str(dest)
        if not dest.exists():
            if name not in PENDING:
                bad.append(f"{target}: no such file")
            continue
        if anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {name}")
    return bad


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page: Path) -> None:
    assert not _broken(page)


def test_the_check_catches_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# Top\n\n## A section\n", encoding="utf-8")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "[ok](../README.md#a-section) [gone](nowhere.md) [bad](../README.md#no-such-heading) "
        "[self](#title) `[code](x.md)` [web](https://example.com/x.md) \n\n# Title\n",
        encoding="utf-8",
    )
    assert _broken(page, root=tmp_path) == [
        "nowhere.md: no such file",
        "../README.md#no-such-heading: no heading #no-such-heading in README.md",
    ]


def test_anchor_follows_github() -> None:
    assert _anchor("Round 9: the n-gram pair's stationary points; preemptions at the top load") == (
        "round-9-the-n-gram-pairs-stationary-points-preemptions-at-the-top-load"
    )
    assert (
        _anchor("Should I turn speculation on? (`specgate advise`)")
        == "should-i-turn-speculation-on-specgate-advise"
    )
    assert _anchor("Every request's end: `--access-log`") == "every-requests-end---access-log"
    assert _anchor("Where it stands (vLLM 0.26.0, one H200)") == "where-it-stands-vllm-0260-one-h200"
