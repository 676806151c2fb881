"""A request body, read and parsed with its cost bounded whatever the client sends.

- Encoding: JSON on the wire is UTF-8 (RFC 8259). A body in UTF-16/32 is refused with a
  400 before anything else looks at it (the engine would not parse it, and the model-name
  splice works on UTF-8 bytes); so is a byte order mark. ``Content-Encoding`` other than
  identity, gzip, deflate or br is a 415 (br only where the ``brotli`` module is
  installed); a body that does not decode as its declared encoding, a 400. The gateway
  decodes bodies itself (aiohttp's own decoding is off), in a worker thread, and stops at
  ``server.max_body_bytes`` of output (a 413): a bomb costs one limit's worth of CPU, off
  the event loop, and an unread rest is never decompressed.
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
import zlib
from typing import Any

from gateway.api.features import parse_json
from gateway.config.models import ServerConfig
from gateway.wire.errors import ApiError

try:
    import brotli
except ImportError:  # pragma: no cover - an optional codec
    brotli = None

_IDENTITY = frozenset({"", "identity"})
_ZLIB = frozenset({"gzip", "x-gzip", "deflate"})
ALLOWED_ENCODINGS = _IDENTITY | _ZLIB | ({"br"} if brotli is not None else set())
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_OFF_LOOP_BYTES = 256 * 1024
_LARGE_PARSES = asyncio.Semaphore(2)


def _codings(header: str | None) -> list[str]:
    """The codings a ``Content-Encoding`` header lists, in the order they were applied
    (identity left out)."""
    return [c for c in (x.strip().lower() for x in (header or "").split(",")) if c not in _IDENTITY]


def check_content_encoding(header: str | None) -> None:
    if not header:  # none: nothing to check
        return
    bad = [c for c in _codings(header) if c not in ALLOWED_ENCODINGS]
    if bad:
        raise ApiError(
            415,
            f"unsupported Content-Encoding {bad[0][:40]!r}: use "
            + ", ".join(sorted(ALLOWED_ENCODINGS - _IDENTITY))
            + " or none",
            code="unsupported_encoding",
        )


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"request body exceeds {limit} bytes", code="request_too_large")


def _undecodable(coding: str) -> ApiError:
    return ApiError(
        400, f"request body does not decode as its Content-Encoding {coding!r}", code="invalid_body"
    )


def _inflate(raw: bytes, coding: str, limit: int) -> bytes:
    """gzip (all members) or deflate (zlib-wrapped, or raw as some clients send it)."""
    if coding == "deflate":
        wbits = zlib.MAX_WBITS if raw[:1] and raw[0] & 0xF == 8 else -zlib.MAX_WBITS
    else:
        wbits = 16 + zlib.MAX_WBITS
    out: list[bytes] = []
    room = limit + 1
    rest = raw
    while True:
        d = zlib.decompressobj(wbits)
        try:
            piece = d.decompress(rest, room)
        except zlib.error:
            raise _undecodable(coding) from None
        out.append(piece)
        room -= len(piece)
        if room <= 0 or d.unconsumed_tail:
            raise _too_large(limit)
        if not d.eof:
            raise _undecodable(coding)  # cut short
        rest = d.unused_data
        if not rest or wbits != 16 + zlib.MAX_WBITS:
            break  # one deflate stream; or the last gzip member
    if rest:
        raise _undecodable(coding)  # bytes after the deflate stream
    return b"".join(out)


def _unbrotli(raw: bytes, limit: int) -> bytes:
    d = brotli.Decompressor()
    out: list[bytes] = []
    size = 0
    data = raw
    try:
        while True:
            piece = d.process(data, output_buffer_limit=limit + 1 - size)
            data = b""
            out.append(piece)
            size += len(piece)
            if size > limit:
                raise _too_large(limit)
            if d.can_accept_more_data() or not piece:
                break
    except brotli.error:
        raise _undecodable("br") from None
    if not d.is_finished():
        raise _undecodable("br")
    return b"".join(out)


def decode_body(raw: bytes, header: str | None, limit: int) -> bytes:
    """The body with its ``Content-Encoding`` undone (the last coding applied first
    undone), refused at ``limit`` bytes of output: a 413, a 400 if it does not decode."""
    for coding in reversed(_codings(header)):
        raw = _unbrotli(raw, limit) if coding == "br" else _inflate(raw, coding, limit)
    return raw


async def decoded(raw: bytes, header: str | None, limit: int) -> bytes:
    """:func:`decode_body` in a worker thread (two at a time) when there is anything to undo."""
    if not _codings(header):
        return raw
    async with _LARGE_PARSES:
        return await asyncio.to_thread(decode_body, raw, header, limit)


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


def parse_inline(raw: bytes, server: ServerConfig) -> dict[str, Any]:
    check_utf8(raw)
    check_shape(raw, server.max_json_containers, server.max_json_elements)
    return parse_json(raw)


async def parse_body(raw: bytes, server: ServerConfig) -> dict[str, Any]:
    """The request body as a JSON object (OpenAI-shaped 400s otherwise), bounded in cost."""
    if len(raw) <= _OFF_LOOP_BYTES:
        return parse_inline(raw, server)
    async with _LARGE_PARSES:
        return await asyncio.to_thread(parse_inline, raw, server)
