"""The configuration reference, generated from the pydantic models: a JSON Schema of
:class:`~gateway.config.models.GatewayConfig` and a Markdown page with one row per setting
(path, type and range, default, unit, environment variable, description).

``specgate config-reference --out docs/`` writes both (``docs/config.schema.json``,
``docs/config-reference.md``); the test suite fails when the committed files differ from
what this module generates, or when a field has no description.
"""

from __future__ import annotations

import json
import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gateway.config.loader import ENV_PREFIX
from gateway.config.models import GatewayConfig

SCHEMA_FILE = "config.schema.json"
MARKDOWN_FILE = "config-reference.md"
COMMAND = "specgate config-reference --out docs/"
# Name suffix -> unit, longest first (``accepts_per_s`` is a rate, not seconds).
UNITS: tuple[tuple[str, str], ...] = (
    ("_per_s", "per second"),
    ("_bytes", "bytes"),
    ("_tokens", "tokens"),
    ("_ms", "milliseconds"),
    ("_s", "seconds"),
)
_SHORTCUTS = {"server.api_keys": "SPECGATE_API_KEYS", "server.admin_keys": "SPECGATE_ADMIN_KEYS"}


@dataclass(frozen=True, slots=True)
class Setting:
    """One leaf setting of the configuration."""

    path: str  # models[i].timeouts.total_s
    env: str  # SPECGATE_MODELS__<i>__TIMEOUTS__TOTAL_S
    type: str
    default: str
    unit: str
    description: str


@dataclass(frozen=True, slots=True)
class Section:
    """A group of settings: one pydantic model at one path."""

    path: str  # "" for the top level
    description: str
    settings: tuple[Setting, ...]


def unit_of(name: str) -> str:
    """The unit a field's name implies (``timeout_s`` → seconds), else ``""``."""
    return next((unit for suffix, unit in UNITS if name.endswith(suffix)), "")


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds: itself, in a list, or optional."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (list, Union, types.UnionType):
        for arg in get_args(annotation):
            if arg is not type(None) and (model := _model_of(arg)) is not None:
                return model
    return None


def _is_list(annotation: Any) -> bool:
    return get_origin(annotation) is list


def type_name(annotation: Any) -> str:
    """A field's type in words (``number``, ``list of string``, ``"dns" | "kubernetes"``)."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin in (Union, types.UnionType):
        names = [type_name(a) for a in args if a is not type(None)]
        return " | ".join(names) + (" | null" if type(None) in args else "")
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (list, tuple):
        return "list of " + type_name(args[0])
    if origin is dict:
        return f"map of {type_name(args[0])} to {type_name(args[1])}"
    words: dict[Any, str] = {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        SecretStr: "string (secret)",
    }
    if annotation in words:
        return words[annotation]
    return str(getattr(annotation, "__name__", annotation))


def _range(field: FieldInfo) -> str:
    lo = hi = ""
    for m in field.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            v = getattr(m, attr, None)
            if v is not None:
                text = f"{sign} {_number(v)}"
                lo, hi = (text, hi) if attr in ("ge", "gt") else (lo, text)
    return ", ".join(t for t in (lo, hi) if t)


def _value(v: Any) -> str:
    if isinstance(v, SecretStr):
        return "(secret)"
    if isinstance(v, BaseModel):
        v = v.model_dump(mode="json")
    if isinstance(v, list | tuple) and any(isinstance(x, SecretStr) for x in v):
        return "(secrets)"
    return json.dumps(v, ensure_ascii=False, sort_keys=True) if not isinstance(v, str) else v


def _default(field: FieldInfo, parent_default: BaseModel | None, name: str) -> Any:
    """The field's default: from its parent section's default object where that has one
    (``epp.limits.ping.rate``), else its own; ``PydanticUndefined`` when it is required."""
    if parent_default is not None:
        return getattr(parent_default, name)
    if field.default_factory is not None:
        return field.default_factory()  # type: ignore[call-arg]
    return field.default


def _env(path: list[str]) -> str:
    return ENV_PREFIX + "__".join(p if p.startswith("<") else p.upper() for p in path)


def _type(field: FieldInfo) -> str:
    """``type_name`` of the annotation, or the enum of a ``WithJsonSchema`` (the policy name)."""
    for m in field.metadata:
        enum = (getattr(m, "json_schema", None) or {}).get("enum")
        if enum:
            return " | ".join(json.dumps(e) for e in enum)
    return type_name(field.annotation)


def _number(v: float | int) -> str:
    return str(int(v)) if isinstance(v, float) and v.is_integer() else f"{v}"


def sections(
    model: type[BaseModel] = GatewayConfig,
    path: str = "",
    env: tuple[str, ...] = (),
    default: BaseModel | None = None,
    description: str = "",
) -> Iterator[Section]:
    """Every section of the configuration, depth first, the settings of each in field order."""
    rows: list[Setting] = []
    below: list[tuple[type[BaseModel], str, tuple[str, ...], BaseModel | None, str]] = []
    for name, field in model.model_fields.items():
        full = f"{path}.{name}" if path else name
        sub = _model_of(field.annotation)
        desc = (field.description or "").strip()
        if sub is not None:
            value = _default(field, default, name)
            sub_default = value if isinstance(value, BaseModel) else None
            if _is_list(field.annotation):
                index = "<i>" if not env else "<j>"
                below.append((sub, f"{full}[{index[1]}]", (*env, name, index), None, desc))
            else:
                if value is None:
                    desc += " (optional: unset by default)"
                below.append((sub, full, (*env, name), sub_default, desc))
            continue
        value = _default(field, default, name)
        kind = _type(field)
        limits = _range(field)
        env_name = _env([*env, name])
        if full in _SHORTCUTS:
            env_name += f" or {_SHORTCUTS[full]}"
        rows.append(
            Setting(
                path=full,
                env=env_name,
                type=f"{kind} ({limits})" if limits else kind,
                default="required" if value is PydanticUndefined else _value(value),
                unit=unit_of(name),
                description=desc,
            )
        )
    yield Section(path, description, tuple(rows))
    for sub, full, sub_env, sub_default, desc in below:
        yield from sections(sub, full, sub_env, sub_default, desc)


def undescribed(model: type[BaseModel] = GatewayConfig, path: str = "") -> list[str]:
    """Paths of the fields (sections included) that have no description."""
    out: list[str] = []
    for name, field in model.model_fields.items():
        full = f"{path}.{name}" if path else name
        if not (field.description or "").strip():
            out.append(full)
        sub = _model_of(field.annotation)
        if sub is not None:
            out += undescribed(sub, full + ("[i]" if _is_list(field.annotation) else ""))
    return out


def json_schema() -> str:
    schema: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$comment": f"Generated by `{COMMAND}`; do not edit.",
        **GatewayConfig.model_json_schema(),
    }
    return json.dumps(schema, indent=2, ensure_ascii=False, sort_keys=False) + "\n"


def _cell(text: str) -> str:
    return text.replace("``", "`").replace("|", "\\|").replace("\n", " ")


_INTRO = f"""\
# Configuration reference

Generated from the pydantic models (`gateway/config/*.py`, `gateway/routing/config.py`) by
`{COMMAND}`: do not edit by hand. `tests/config/test_reference.py` fails when this
page or [`config.schema.json`](config.schema.json) (the JSON Schema of the same models, for
editors and CI linters) is not what the command writes, and when a field has no description.

Every setting comes from, in increasing priority: the YAML file (`--config`, else
`$SPECGATE_CONFIG`, else the embedded default), the environment variable named in its row,
then the flags of `specgate serve`. `specgate serve --check --explain` prints each
effective value with where it came from. Variable names are case-insensitive, `__`
separates levels, and a list item is addressed by its index (`<i>`: the model's index in
`models`, `<j>`: the pair's in that model's `pairs`); a variable whose value starts with
`[` or `{{` is read as JSON. Every section rejects unknown keys. Units: from the name's
suffix (`_s` seconds, `_ms` milliseconds, `_bytes` bytes, `_per_s` per second, `_tokens`
tokens), else in the description.
"""


def markdown() -> str:
    out = [_INTRO]
    for sec in sections():
        if not sec.path and not sec.settings:
            continue
        out.append(f"\n## `{sec.path}`\n")
        if sec.description:
            text = sec.description.rstrip(".")
            out.append(f"\n{text[:1].upper()}{text[1:]}.\n")
        if not sec.settings:
            continue
        out.append("\n| setting | type | default | unit | environment variable | description |\n")
        out.append("|---|---|---|---|---|---|\n")
        for s in sec.settings:
            cells = [
                f"`{s.path}`",
                _cell(s.type),
                f"`{_cell(s.default)}`" if s.default != "required" else "required",
                s.unit or "—",
                f"`{s.env}`".replace(" or ", "` or `"),
                _cell(s.description),
            ]
            out.append("| " + " | ".join(cells) + " |\n")
    return "".join(out)


def files() -> dict[str, str]:
    """File name → content, as the command writes them."""
    return {SCHEMA_FILE: json_schema(), MARKDOWN_FILE: markdown()}
