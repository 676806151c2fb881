"""The lab composes the emulator, the gateway and telemetry; none of those reaches up into it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import gateway

ROOT = Path(gateway.__file__).parent


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside a function."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


@pytest.mark.parametrize("package", ["telemetry", "emulator"])
def test_package_does_not_import_the_gateway_app_or_the_lab(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files
    bad = {
        f"{f.relative_to(ROOT)}: {m}"
        for f in files
        for m in _imports(f)
        if m.split(".")[:2] in (["gateway", "api"], ["gateway", "lab"])
    }
    assert not bad
