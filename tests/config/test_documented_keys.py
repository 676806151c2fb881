"""Every ``SPECGATE_API_KEYS=...`` / ``SPECGATE_ADMIN_KEYS=...`` example in the docs works as copied."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.api.cli_serve import DESCRIPTION
from gateway.config import load_config

ROOT = Path(__file__).resolve().parents[2]
_EXAMPLE = re.compile(r"\b(SPECGATE_(?:API|ADMIN)_KEYS)=([^\s`'\")]+)")
DOCUMENTED = [
    "README.md",
    "docs/gateway.md",
    "Dockerfile",
    "deploy/compose/gateway.yaml",
    "gateway/config/default.yaml",
    "gateway/config/loader.py",
]


def _examples(text: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2).rstrip(".,;")) for m in _EXAMPLE.finditer(text)]


@pytest.mark.parametrize("source", [*DOCUMENTED, "specgate serve --help"])
def test_key_examples_are_accepted(source: str) -> None:
    text = DESCRIPTION if source.startswith("specgate") else (ROOT / source).read_text(encoding="utf-8")
    examples = _examples(text)
    assert examples, f"{source} no longer shows a key example: drop it from this test"
    for var, value in examples:
        cfg = load_config(None, env={var: value})
        keys = cfg.server.api_keys if var == "SPECGATE_API_KEYS" else cfg.server.admin_keys
        assert len(keys) == len(value.split(",")), (source, var, value)
