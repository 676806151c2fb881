"""Structured access log: one line per request, logger ``specgate.access``.

Fields are metadata only (model, route, reason, engine, status, timings, token counts);
prompt and completion text are never passed to telemetry, so they cannot be logged here.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from typing import Literal

ACCESS_LOGGER = "specgate.access"
ACCESS_FIELDS_ATTR = "access_fields"  # LogRecord attribute holding the access line's fields
access_log = logging.getLogger(ACCESS_LOGGER)

Field = str | int | float | bool | None
_NEEDS_QUOTES = re.compile(r'[^\x21-\x7e]|["=\\]')


def _logfmt_value(v: Field) -> str:
    if v is None:
        return "-"
    if v is True or v is False:
        return "true" if v else "false"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, int):
        return str(v)
    # Label-like values (the usual case) pass with C-level scans; anything else is checked
    # by the regex and quoted when needed.
    if v and v.isascii() and v.isprintable() and not _has_special(v):
        return v
    if v == "" or _NEEDS_QUOTES.search(v):
        return json.dumps(v)
    return v


def _has_special(v: str) -> bool:
    return " " in v or '"' in v or "=" in v or "\\" in v


def format_line(fields: Mapping[str, Field], fmt: Literal["text", "json"]) -> str:
    if fmt == "json":
        return json.dumps({k: v for k, v in fields.items() if v is not None}, separators=(",", ":"))
    return " ".join(f"{k}={_logfmt_value(v)}" for k, v in fields.items())


def emit(fields: Mapping[str, Field], fmt: Literal["text", "json"]) -> None:
    if access_log.isEnabledFor(logging.INFO):
        # request_id and the fields themselves also as record attributes, so a structured
        # formatter (``specgate serve --log-json``) emits them as keys, not a string in "msg".
        access_log.info(
            format_line(fields, fmt),
            extra={"request_id": fields.get("request_id"), ACCESS_FIELDS_ATTR: fields},
        )
