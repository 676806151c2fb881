"""Each effective setting of a loaded configuration with where its value came from
(``specgate serve --check --explain``): the model's default, the file, an environment
variable or a command-line flag. Secrets print masked, as in ``--check``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

from pydantic import BaseModel

from gateway.config.loader import DEFAULT_CONFIG_NAME, Origins
from gateway.config.models import GatewayConfig


def settings(model: BaseModel, dumped: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted path, JSON value)`` of every leaf setting, sections walked in field order
    (list items of sections by index: ``models.0.pairs.0.spec.url``)."""
    for name in type(model).model_fields:
        value, plain = getattr(model, name), dumped[name]
        path = f"{prefix}.{name}" if prefix else name
        if isinstance(value, BaseModel):
            yield from settings(value, plain, path)
        elif isinstance(value, list) and value and all(isinstance(v, BaseModel) for v in value):
            for i, item in enumerate(value):
                yield from settings(item, plain[i], f"{path}.{i}")
        else:
            yield path, plain


def display_path(dotted: str) -> str:
    """``models.0.routing.policy`` → ``models[0].routing.policy``."""
    out = ""
    for part in dotted.split("."):
        out += f"[{part}]" if part.isdecimal() else (f".{part}" if out else part)
    return out


def _source(origins: Origins, path: str, flag_of: Callable[[str], str]) -> str:
    layer, detail = origins.of(path)
    if layer == "cli":
        return f"command line ({flag_of(detail)})"
    if layer == "env":
        return f"environment {detail}"
    if layer == "file":
        return "embedded default config" if detail == DEFAULT_CONFIG_NAME else f"file {detail}"
    return "default"


def explain(cfg: GatewayConfig, origins: Origins, flag_of: Callable[[str], str] = lambda path: path) -> str:
    """One line per setting: ``path = value  # source``, values as JSON (secrets masked)."""
    rows = [
        (display_path(p), json.dumps(v, ensure_ascii=False), _source(origins, p, flag_of))
        for p, v in settings(cfg, cfg.model_dump(mode="json"))
    ]
    width = min(64, max(len(p) + len(v) for p, v, _ in rows) + 3)
    return "\n".join(f"{f'{p} = {v}':<{width}}  # {src}" for p, v, src in rows) + "\n"
