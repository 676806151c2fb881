"""Load the gateway configuration: YAML file, then ``SPECGATE_*`` env vars, then CLI flags.

The environment is read by pydantic-settings (prefix ``SPECGATE_``, ``__`` as the nesting
separator, case-insensitive names): ``SPECGATE_SERVER__PORT=9000`` sets ``server.port``
and a list item is addressed by its index, ``SPECGATE_MODELS__0__TIMEOUTS__TOTAL_S=30``
sets ``models[0].timeouts.total_s``. Values are plain strings that pydantic converts
(``"9000"`` → 9000, ``"true"`` → True); for a list or mapping, a value starting with
``[`` or ``{`` is read as JSON (else the field takes the string: key lists split
``"a,b"``). Two shortcuts: ``SPECGATE_API_KEYS=client-key-1,client-key-2`` and
``SPECGATE_ADMIN_KEYS=admin-key-1``. ``SPECGATE_CONFIG`` names the file when none is
given. Other ``SPECGATE_*`` variables without ``__`` (``SPECGATE_HEALTH_PORT``) are not
configuration and are left alone; one with ``__`` must name a section
(``SPECGATE_SERVR__PORT`` is an error, as a misspelt field is). Overrides (from CLI
flags) are a mapping of dotted paths (``{"server.port": 9000}``) or nested dicts; None
values are skipped.

Each layer changes only what it sets: mappings merge key by key, a list takes its items
by index, anything else replaces the value below (``SPECGATE_SERVER__PORT`` keeps the
file's other ``server`` settings; ``SPECGATE_MODELS='[...]'`` replaces the list).

Every failure raises :class:`ConfigError` whose message names the file (or the
environment variable), the field path and what is wrong.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, get_args, get_origin

import yaml
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict

from gateway.config.models import GatewayConfig

ENV_PREFIX = "SPECGATE_"
DEFAULT_CONFIG_NAME = "<embedded default.yaml>"
_SECTIONS = sorted(GatewayConfig.model_fields)
_CLI = "a command-line option"
_SHORTCUTS = {"api_keys": "server__api_keys", "admin_keys": "server__admin_keys"}


class ConfigError(Exception):
    """An invalid configuration. The message is meant for the operator, as is."""


class _EnvSettings(BaseSettings, GatewayConfig):
    """GatewayConfig's fields for pydantic-settings' env source to read by; never instantiated
    (GatewayConfig validates the merged layers)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, env_nested_delimiter="__", case_sensitive=False)


class _EnvSource(EnvSettingsSource):
    """pydantic-settings' environment source over the given variables, stepping into list
    items by index and reading JSON only from values that start with ``[`` or ``{``
    (pydantic-settings' own decoding fails on any other value of a list field)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._env = {name.lower(): value for name, value in env.items()}
        super().__init__(_EnvSettings)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return self._env

    def next_field(self, field: FieldInfo | Any | None, key: str, *args: Any) -> FieldInfo | None:
        annotation = field.annotation if isinstance(field, FieldInfo) else field
        if key.isdecimal() and get_origin(annotation) is list:
            return FieldInfo.from_annotation(get_args(annotation)[0])
        return super().next_field(field, key, *args)

    def decode_complex_value(self, field_name: str, field: FieldInfo | None, value: Any) -> Any:
        if isinstance(value, str) and value.lstrip()[:1] in ("[", "{"):
            with contextlib.suppress(ValueError):
                return json.loads(value)
        return value


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


def _read_env(env: Mapping[str, str], origins: dict[str, str]) -> dict[str, Any]:
    """The configuration the ``SPECGATE_*`` variables set, as nested values (``models`` as a
    mapping of indexes); records field path → variable name in ``origins``. A variable with
    ``__`` names a section and no empty level: a typo fails, naming the variable."""
    ours: dict[str, str] = {}
    for name in sorted(env):
        if not name.upper().startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX) :].lower()
        path = _SHORTCUTS.get(rest, rest).split("__")
        if len(path) == 1 and path[0] not in _SECTIONS:
            continue  # not a config variable (e.g. SPECGATE_CONFIG, SPECGATE_HEALTH_PORT)
        if not all(path):
            raise ConfigError(f"environment variable {name}: empty name between '__' separators")
        if path[0] not in _SECTIONS:
            close = difflib.get_close_matches(path[0], _SECTIONS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                f"environment variable {name}: unknown section {path[0]!r} (check the spelling; {hint}"
                f"sections: {', '.join(_SECTIONS)})"
            )
        ours[ENV_PREFIX + "__".join(path)] = env[name]
        origins[".".join(path)] = name
    try:
        return _EnvSource(ours)()
    except ValueError as exc:  # pydantic-settings' SettingsError; not expected: decoding never fails
        raise ConfigError(f"environment variables: {exc}") from None


def _flatten(overrides: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            out.update(_flatten(value, full))
        elif value is not None:
            out[full] = value
    return out


def _patch(base: Any, layer: Any, origins: Mapping[str, str], path: str = "") -> Any:
    """``layer`` over ``base``: mappings merge key by key, a list takes a mapping of its
    indexes item by item, anything else replaces."""
    if not isinstance(layer, Mapping) or base is None:
        return layer
    if isinstance(base, Mapping):
        at = f"{path}." if path else ""
        return {**base, **{k: _patch(base.get(k), v, origins, f"{at}{k}") for k, v in layer.items()}}
    if not isinstance(base, list):
        raise ConfigError(f"{_set_by(origins, path)}: {path} is not a mapping")
    items = list(base)
    for key, value in layer.items():
        where = f"{path}.{key}"
        if not str(key).isdecimal() or int(key) >= len(items):
            problem = f"index {key} out of range for" if str(key).isdecimal() else "expected an index into"
            raise ConfigError(f"{_set_by(origins, where)}: {problem} {path} (a list of {len(items)})")
        items[int(key)] = _patch(items[int(key)], value, origins, where)
    return items


def _set_by(origins: Mapping[str, str], path: str) -> str:
    """Who set ``path`` or a value below it (for an error found while merging)."""
    by = next((o for p, o in origins.items() if p == path or p.startswith(path + ".")), _CLI)
    return by if by == _CLI else f"environment variable {by}"


def _loc(loc: tuple[int | str, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or "(top level)"


def _format_validation(exc: ValidationError, source: str, origins: Mapping[str, str]) -> str:
    lines = []
    for err in exc.errors(include_url=False, include_input=False):
        dotted = ".".join(str(p) for p in err["loc"])
        origin = next((o for p, o in origins.items() if dotted == p or dotted.startswith(p + ".")), None)
        where = f" (set by {origin})" if origin else ""
        msg = "unknown field (check the spelling)" if err["type"] == "extra_forbidden" else err["msg"]
        lines.append(f"  {_loc(err['loc'])}{where}: {msg}")
    n = len(lines)
    return f"{source}: {n} invalid setting{'s' if n > 1 else ''}:\n" + "\n".join(lines)


@dataclass(frozen=True, slots=True)
class Layer:
    """What one source of the configuration set: ``kind`` is ``cli``, ``env`` or ``file``;
    ``set`` maps each dotted path it set (list items by index: ``models.0.routing.policy``)
    to a detail (the override's path, the variable, the file's name); ``replaced`` holds the
    paths where it gave a whole list, which replaces the lists of the layers below."""

    kind: str
    set: Mapping[str, str]
    replaced: frozenset[str]

    @classmethod
    def of(cls, kind: str, data: Any, detail: Callable[[str], str]) -> Layer:
        leaves, lists = _walk(data)
        return cls(kind, {p: detail(p) for p in leaves}, frozenset(lists))


@dataclass(frozen=True, slots=True)
class Origins:
    """Where the settings of a loaded configuration came from: its layers, highest first."""

    layers: tuple[Layer, ...]

    def of(self, path: str) -> tuple[str, str]:
        """``(kind, detail)`` of the layer that gave the value at ``path``: the highest one
        that set it (or a mapping value above it, or entries of a mapping value it is) or
        ``("default", "")``: the model's default, or a value derived by a validator."""
        for layer in self.layers:
            detail = next((d for p, d in layer.set.items() if _related(p, path)), None)
            if detail is not None:
                return layer.kind, detail
            if any(path.startswith(r + ".") for r in layer.replaced):
                break  # a list this layer gave whole, without this setting
        return "default", ""


def _variable(variables: Mapping[str, str], path: str) -> str:
    return next(var for p, var in variables.items() if _related(p, path))


def _related(a: str, b: str) -> bool:
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _walk(data: Any, prefix: str = "") -> tuple[list[str], list[str]]:
    """The dotted paths of the values a layer sets (into mappings and lists of mappings; an
    empty mapping sets nothing), and those where it gives a list of mappings."""
    leaves: list[str] = []
    lists: list[str] = []
    if isinstance(data, Mapping):
        for key, value in data.items():
            sub = _walk(value, f"{prefix}.{key}" if prefix else str(key))
            leaves += sub[0]
            lists += sub[1]
    elif isinstance(data, list) and data and all(isinstance(v, Mapping) for v in data):
        lists.append(prefix)
        for i, value in enumerate(data):
            sub = _walk(value, f"{prefix}.{i}")
            leaves += sub[0]
            lists += sub[1]
    elif prefix:
        leaves.append(prefix)
    return leaves, lists


def load_config(
    path: str | Path | None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> GatewayConfig:
    """Read, merge and validate the configuration. Raises :class:`ConfigError`."""
    return load_config_with_origins(path, env=env, overrides=overrides)[0]


def load_config_with_origins(
    path: str | Path | None,
    *,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> tuple[GatewayConfig, Origins]:
    """:func:`load_config`, and where each setting came from (:class:`Origins`)."""
    env = os.environ if env is None else env
    if path is None and env.get(ENV_PREFIX + "CONFIG"):
        path = env[ENV_PREFIX + "CONFIG"]
    data, source = _read_yaml(Path(path) if path is not None else None)
    layers = [Layer.of("file", data, lambda p: source)]
    origins: dict[str, str] = {}
    from_env = _read_env(env, origins)
    variables = dict(origins)
    data = _patch(data, from_env, origins)
    layers.append(Layer.of("env", from_env, lambda p: _variable(variables, p)))
    cli: dict[str, Any] = {}
    flat = _flatten(overrides or {})
    for dotted, value in flat.items():
        origins[dotted] = _CLI
        for key in reversed(dotted.split(".")):
            value = {key: value}
        data = _patch(data, value, origins)
        cli = _patch(cli, value, origins)
    layers.append(Layer.of("cli", cli, lambda p: next(k for k in flat if _related(k, p))))
    try:
        cfg = GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation(exc, source, origins)) from None
    return cfg, Origins(tuple(reversed(layers)))
