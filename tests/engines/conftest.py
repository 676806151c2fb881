from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.20.2"


@pytest.fixture(scope="session")
def spec_page() -> str:
    return (FIXTURES / "metrics-spec.txt").read_text()


@pytest.fixture(scope="session")
def base_page() -> str:
    return (FIXTURES / "metrics-base.txt").read_text()


def bump(page: str, name: str, old: float, new: float) -> str:
    """Replace one sample value on a page (the sample line must exist)."""
    needle = f"{name} {old!r}"
    assert needle in page, needle
    return page.replace(needle, f"{name} {new!r}")
