"""Load the gateway configuration: YAML file, then ``SPECGATE_*`` env vars, then CLI flags.

Environment variables use ``__`` as the nesting separator and are case-insensitive
on the field names: ``SPECGATE_SERVER__PORT=9000`` sets ``server.port``,
``SPECGATE_MODELS__0__TIMEOUTS__TOTAL_S=30`` sets ``models[0].timeouts.total_s``.
Values are plain strings that pydantic converts (``"9000"`` → 9000, ``"true"`` →
True); a value starting with ``[`` or ``{`` is read as JSON. Two shortcuts:
``SPECGATE_API_KEYS=client-key-1,client-key-2`` and ``SPECGATE_ADMIN_KEYS=admin-key-1``.
``SPECGATE_CONFIG`` names the file when none is given. Other ``SPECGATE_*`` variables
without ``__`` (``SPECGATE_HEALTH_PORT``) are not configuration and are left alone; one
with ``__`` must name a section (``SPECGATE_SERVR__PORT`` is an error, as a misspelt
field is). Overrides (from CLI flags) are a mapping of
dotted paths (``{"server.port": 9000}``) or nested dicts.

Every failure raises :class:`ConfigError` whose message names the file (or the
environment variable), the field path and what is wrong.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gateway.config.models import GatewayConfig

ENV_PREFIX = "SPECGATE_"
DEFAULT_CONFIG_NAME = "<embedded default.yaml>"
_TOP_LEVEL = frozenset(GatewayConfig.model_fields)
_SHORTCUTS = {"API_KEYS": ("server", "api_keys"), "ADMIN_KEYS": ("server", "admin_keys")}


class ConfigError(Exception):
    """An invalid configuration. The message is meant for the operator, as is."""


def default_config_text() -> str:
    return resources.files("gateway.config").joinpath("default.yaml").read_text(encoding="utf-8")


def _read_yaml(path: Path | None) -> tuple[dict[str, Any], str]:
    if path is None:
        text, source = default_config_text(), DEFAULT_CONFIG_NAME
    else:
        source = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"{source}: file not found") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{source}: cannot read: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}{where}: invalid YAML: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping, got {type(data).__name__}")
    return data, source


def _set_path(data: dict[str, Any], path: list[str], value: Any, origin: str) -> None:
    node: Any = data
    for i, key in enumerate(path):
        last = i == len(path) - 1
        if isinstance(node, list):
            try:
                idx = int(key)
            except ValueError:
                raise ConfigError(f"{origin}: {'.'.join(path[:i])} is a list; expected an index") from None
            if not 0 <= idx < len(node):
                raise ConfigError(f"{origin}: index {idx} out of range for {'.'.join(path[:i]) or 'list'}")
            if last:
                node[idx] = value
            else:
                node = node[idx]
            continue
        if not isinstance(node, dict):
            raise ConfigError(f"{origin}: {'.'.join(path[:i])} is not a mapping")
        if last:
            node[key] = value
        else:
            nxt = node.get(key)
            if nxt is None:
                nxt = node[key] = {}
            node = nxt


def _env_value(raw: str) -> Any:
    s = raw.strip()
    if s[:1] in ("[", "{"):
        try:
            return json.loads(s)
        except json.JSONDecodeError:
            return raw
    return raw


def _check_env_path(name: str, path: list[str]) -> None:
    """A ``SPECGATE_<SECTION>__...`` variable names a section that exists, and no empty
    level: a typo fails as a field typo does, naming the variable, instead of being ignored."""
    origin = f"environment variable {name}"
    if any(not p for p in path):
        raise ConfigError(f"{origin}: empty name between '__' separators")
    if path[0] not in _TOP_LEVEL:
        close = difflib.get_close_matches(path[0], sorted(_TOP_LEVEL), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(
            f"{origin}: unknown section {path[0]!r} (check the spelling; {hint}"
            f"sections: {', '.join(sorted(_TOP_LEVEL))})"
        )


def _apply_env(data: dict[str, Any], env: Mapping[str, str]) -> dict[str, str]:
    """Apply SPECGATE_* variables in place; returns field path → variable name."""
    origins: dict[str, str] = {}
    for name in sorted(env):
        if not name.upper().startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX) :].upper()
        if rest in _SHORTCUTS:
            path = list(_SHORTCUTS[rest])
        else:
            path = [p.lower() for p in rest.split("__")]
            if len(path) == 1 and path[0] not in _TOP_LEVEL:
                continue  # not a config variable (e.g. SPECGATE_CONFIG, SPECGATE_HEALTH_PORT)
            _check_env_path(name, path)
        _set_path(data, path, _env_value(env[name]), f"environment variable {name}")
        origins[".".join(path)] = name
    return origins


def _flatten(overrides: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            out.update(_flatten(value, full))
        else:
            out[full] = value
    return out


def _loc(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for p in loc:
        if isinstance(p, int):
            parts.append(f"[{p}]")
        else:
            parts.append(("." if parts else "") + str(p))
    return "".join(parts) or "(top level)"


def _format_validation(exc: ValidationError, source: str, origins: Mapping[str, str]) -> str:
    lines = []
    for err in exc.errors(include_url=False, include_input=False):
        loc = err["loc"]
        dotted = ".".join(str(p) for p in loc)
        origin = next(
            (o for path, o in origins.items() if dotted == path or dotted.startswith(path + ".")), None
        )
        where = f" (set by {origin})" if origin else ""
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling)"
        lines.append(f"  {_loc(loc)}{where}: {msg}")
    n = len(lines)
    return f"{source}: {n} invalid setting{'s' if n > 1 else ''}:\n" + "\n".join(lines)


def load_config(
    path: str | Path | None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> GatewayConfig:
    """Read, merge and validate the configuration. Raises :class:`ConfigError`."""
    env = os.environ if env is None else env
    if path is None and env.get(ENV_PREFIX + "CONFIG"):
        path = env[ENV_PREFIX + "CONFIG"]
    data, source = _read_yaml(Path(path) if path is not None else None)
    origins = _apply_env(data, env)
    for dotted, value in _flatten(overrides or {}).items():
        if value is None:
            continue
        parts = dotted.split(".")
        _set_path(data, parts, value, f"command-line option for {dotted}")
        origins[dotted] = "a command-line option"
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation(exc, source, origins)) from None
