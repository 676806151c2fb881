"""The README's commands follow its one stated convention: run in the activated `.venv`
(`specgate ...`, `python ...`), never `python3` or a `.venv/bin/` prefix."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
_FENCE = re.compile(r"^```(?:bash|sh|console)?\n(.*?)^```", re.M | re.S)
_OFF_CONVENTION = re.compile(r"(^|[\s;&|(`])(python3|\.venv/bin/(?!activate\b)\S+)")


def test_readme_states_the_convention_once() -> None:
    text = README.read_text(encoding="utf-8")
    assert text.count(". .venv/bin/activate") == 1


def test_readme_commands_run_in_the_activated_environment() -> None:
    text = README.read_text(encoding="utf-8")
    blocks = _FENCE.findall(text)
    assert blocks
    bad = [
        line.strip()
        for block in blocks
        for line in block.splitlines()
        if _OFF_CONVENTION.search(line.split("#", 1)[0])
    ]
    inline = [m.group(0) for m in re.finditer(r"`(python3|\.venv/bin/python)[^`]*`", text)]
    assert not bad and not inline, bad + inline


def test_readme_is_a_product_page_of_at_most_400_lines() -> None:
    """The README says what specgate is and when it pays; the rest lives in docs/ (docs/README.md)."""
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 400, f"README.md has {len(lines)} lines: move the detail to a docs/ page"
    first_screen = "\n".join(lines[:50])
    assert "make demo" in first_screen and "make test" in first_screen
