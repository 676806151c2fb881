"""Shared helpers of the deployment tests: repository paths and YAML loading."""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from specgate_lab.emulator import cli_emulate

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE_DIR = DEPLOY / "compose"


def load_module(path: Path, name: str) -> ModuleType:
    """Import a stand-alone script (not part of a package) by file path."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def require_tool(name: str) -> str:
    """The path of an installed tool; skips the test without it, fails it under CI=true
    (where `make system-deps` must have installed it)."""
    path = shutil.which(name)
    if path is None:
        msg = f"{name} is not installed (make system-deps installs the Debian package)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def yaml_docs(path: Path) -> list[dict[str, Any]]:
    """Every non-empty YAML document of a file."""
    with path.open(encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def flag(argv: list[str], name: str) -> str | None:
    """The value of ``name`` in an argv (``--x v`` or ``--x=v``), or None."""
    for i, a in enumerate(argv):
        if a == name:
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def emulator_engines(argv: list[str]) -> dict[int, tuple[str, dict[str, Any] | None, str, bool]]:
    """What `specgate <argv>` (an `emulate` command line) serves, per port: served model name,
    speculative config (None when plain), device timeline and whether vllm:* metrics are on —
    read through the emulator's own argument parser, so it cannot drift from the CLI."""
    assert argv[0] == "emulate", argv
    parser = argparse.ArgumentParser(prog="specgate emulate")
    cli_emulate.configure(parser)
    launches, _ = cli_emulate.build_launches(parser.parse_args(argv[1:]))
    out: dict[int, tuple[str, dict[str, Any] | None, str, bool]] = {}
    for ln in launches:
        assert ln.host == "0.0.0.0", "in a container the emulator must listen on all interfaces"
        spec = ln.config.spec.as_dict() if ln.config.spec is not None else None
        out[ln.port] = (ln.config.served_model_name, spec, ln.device, ln.log_stats)
    return out


_VAR = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    r"|(?P<named>[A-Za-z_][A-Za-z0-9_]*))"
)


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's variable interpolation, applied to every string of the parsed file."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        if m["escaped"]:
            return "$"
        name = m["braced"] or m["named"]
        op, arg = m["op"], m["arg"] or ""
        current = env.get(name)
        unset_or_empty = current is None or (op is not None and op.startswith(":") and current == "")
        if op in (":-", "-") and unset_or_empty:
            return arg
        if op in (":?", "?") and unset_or_empty:
            raise AssertionError(f"required variable {name}: {arg}")
        return current or ""

    return _VAR.sub(sub, value)


def find(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


def one(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(objs, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]
