"""Structured access log: one line per request, logger ``specgate.access``.

Fields are metadata only (model, route, reason, engine, status, timings, token counts);
prompt and completion text are never passed to telemetry, so they cannot be logged here.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Literal

ACCESS_LOGGER = "specgate.access"
access_log = logging.getLogger(ACCESS_LOGGER)

Field = str | int | float | bool | None


def _logfmt_value(v: Field) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:.6g}"
    s = str(v)
    if s == "" or any(c in s for c in ' "=\\') or not s.isprintable():
        return json.dumps(s)
    return s


def format_line(fields: Mapping[str, Field], fmt: Literal["text", "json"]) -> str:
    if fmt == "json":
        return json.dumps({k: v for k, v in fields.items() if v is not None}, separators=(",", ":"))
    return " ".join(f"{k}={_logfmt_value(v)}" for k, v in fields.items())


def emit(fields: Mapping[str, Field], fmt: Literal["text", "json"]) -> None:
    if access_log.isEnabledFor(logging.INFO):
        access_log.info(format_line(fields, fmt))
