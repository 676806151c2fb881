"""A request body, read and parsed with its cost bounded whatever the client sends.

- Encoding: JSON on the wire is UTF-8 (RFC 8259). A body in UTF-16/32 is refused with a
  400 before anything else looks at it (the engine would not parse it, and the model-name
  splice works on UTF-8 bytes); so is a byte order mark. ``Content-Encoding`` other than
  identity, gzip, deflate or br is a 415; a body that does not decode as its declared
  encoding, a 400 (decompression itself is bounded by ``server.max_body_bytes``).
- Shape: before any Python object is built, a byte-level scan (C-speed: strings are
  blanked by one regex, then brackets and commas counted) refuses bodies with more JSON
  containers or elements than ``server.max_json_containers`` / ``max_json_elements``:
  ``[{},{},…]`` costs ~100 bytes of memory per 3 bytes of body when materialised.
- Time: a body above ``_OFF_LOOP_BYTES`` is scanned and parsed in a worker thread, at
  most ``_LARGE_PARSES`` at a time, so the event loop keeps answering meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

from gateway.api.features import parse_json
from gateway.config.models import ServerConfig
from gateway.wire.errors import ApiError

ALLOWED_ENCODINGS = frozenset({"", "identity", "gzip", "x-gzip", "deflate", "br"})
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_OFF_LOOP_BYTES = 256 * 1024
_LARGE_PARSES = asyncio.Semaphore(2)


def check_content_encoding(header: str | None) -> None:
    codings = [c.strip().lower() for c in (header or "").split(",")]
    bad = [c for c in codings if c not in ALLOWED_ENCODINGS]
    if bad:
        raise ApiError(
            415,
            f"unsupported Content-Encoding {bad[0][:40]!r}: use gzip, deflate, br or none",
            code="unsupported_encoding",
        )


def check_utf8(raw: bytes) -> None:
    """JSON text on the wire is UTF-8 without a byte order mark (RFC 8259 lets a parser
    refuse one; the body is forwarded as sent, and an engine may not take it)."""
    if json.detect_encoding(raw) != "utf-8":
        raise ApiError(400, "request body must be JSON encoded as UTF-8", code="invalid_encoding")


def check_shape(raw: bytes, max_containers: int, max_elements: int) -> None:
    """Refuse a body whose JSON would build too many objects, from its bytes alone."""
    if len(raw) < 2 * max_containers and len(raw) < 2 * max_elements:
        return  # too short to hold that many: nothing to count
    skeleton = _STRING.sub(b'""', raw)
    containers = skeleton.count(b"{") + skeleton.count(b"[")
    if containers > max_containers:
        raise ApiError(
            400,
            f"request body has more than {max_containers} JSON objects/arrays",
            code="body_too_complex",
        )
    if containers + skeleton.count(b",") > max_elements:
        raise ApiError(
            400, f"request body has more than {max_elements} JSON elements", code="body_too_complex"
        )


def _parse(raw: bytes, server: ServerConfig) -> dict[str, Any]:
    check_utf8(raw)
    check_shape(raw, server.max_json_containers, server.max_json_elements)
    return parse_json(raw)


async def parse_body(raw: bytes, server: ServerConfig) -> dict[str, Any]:
    """The request body as a JSON object (OpenAI-shaped 400s otherwise), bounded in cost."""
    if len(raw) <= _OFF_LOOP_BYTES:
        return _parse(raw, server)
    async with _LARGE_PARSES:
        return await asyncio.to_thread(_parse, raw, server)
