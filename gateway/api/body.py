"""A request body, read and parsed with its cost bounded whatever the client sends.

- Encoding: JSON on the wire is UTF-8 (RFC 8259). A body in UTF-16/32 is refused with a
  400 before anything else looks at it (the engine would not parse it, and the model-name
  splice works on UTF-8 bytes); so is a byte order mark. ``Content-Encoding`` other than
  identity, gzip, deflate or br (``brotli``, a dependency) is a 415; a body that does not
  decode as its declared encoding, a 400. The gateway
  decodes bodies itself (aiohttp's own decoding is off), in a worker thread, and stops at
  ``server.max_body_bytes`` of output (a 413): a bomb costs one limit's worth of CPU, off
  the event loop, and an unread rest is never decompressed.
- Shape: before any Python object is built, a byte-level scan refuses bodies with more
  JSON containers or elements than ``server.max_json_containers`` / ``max_json_elements``:
  ``[{},{},…]`` costs ~100 bytes of memory per 3 bytes of body when materialised. The raw
  counts of brackets and commas bound the real ones from above (text inside strings only
  adds), so most bodies pass on a few ``bytes.count`` calls; only a body whose raw counts
  exceed a limit is scanned exactly (:func:`structure_counts`), in slices of
  ``_SLICE_BYTES`` so that a worker thread doing it hands the interpreter back to the
  event loop between slices (one long C call would hold the GIL throughout).
- Time: a body above ``OFF_LOOP_BYTES`` is scanned, parsed and turned into routing
  features in a worker thread, at most ``_LARGE_PARSES`` at a time, so the event loop
  keeps answering meanwhile. Each of these steps is linear in the body's bytes with
  small constants, and the features examine a bounded prefix of the prompt text
  (:data:`~gateway.pipeline.request.MAX_PROMPT_TEXT`), so the CPU a request costs is
  bounded by ``server.max_body_bytes`` whatever the body holds.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from typing import Any

import brotli

from gateway.api.features import ParsedRequest, parse_json, parse_request
from gateway.config.models import ServerConfig
from gateway.wire.errors import ApiError

_IDENTITY = frozenset({"", "identity"})
_ZLIB = frozenset({"gzip", "x-gzip", "deflate"})
ALLOWED_ENCODINGS = _IDENTITY | _ZLIB | {"br"}
# Every byte but the quote and the bytes counted: deleted before the exact scan.
_NOT_STRUCTURAL = bytes(b for b in range(256) if b not in b'"{[,')
_SLICE_BYTES = 64 * 1024
OFF_LOOP_BYTES = 256 * 1024
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


def structure_counts(raw: bytes, max_containers: int, max_elements: int) -> tuple[int, int]:
    """(containers, elements) of the JSON text ``raw`` outside its strings, counting stopped
    once either exceeds its limit.

    Escapes are removed first (``\\\\`` pairs, then ``\\"``), so every quote left delimits
    a string; then every byte but quotes, ``{``, ``[`` and ``,`` is deleted, and the rest is
    split on quotes slice by slice, keeping the parity of the quotes seen. Exact on the
    longest valid JSON prefix of ``raw``, which is all a parser would build.
    """
    plain = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _NOT_STRUCTURAL)
    inside = False
    containers = commas = 0
    for start in range(0, len(plain), _SLICE_BYTES):
        parts = plain[start : start + _SLICE_BYTES].split(b'"')
        outside = b"".join(parts[1 if inside else 0 :: 2])
        inside ^= len(parts) % 2 == 0  # an odd number of quotes in the slice
        containers += outside.count(b"{") + outside.count(b"[")
        commas += outside.count(b",")
        if containers > max_containers or containers + commas > max_elements:
            break
    return containers, containers + commas


def check_shape(raw: bytes, max_containers: int, max_elements: int) -> None:
    """Refuse a body whose JSON would build too many objects, from its bytes alone."""
    if len(raw) < 2 * max_containers and len(raw) < 2 * max_elements:
        return  # too short to hold that many: nothing to count
    containers = raw.count(b"{") + raw.count(b"[")
    if containers <= max_containers and containers + raw.count(b",") <= max_elements:
        return  # upper bounds within the limits: so are the real counts
    containers, elements = structure_counts(raw, max_containers, max_elements)
    if containers > max_containers:
        raise ApiError(
            400,
            f"request body has more than {max_containers} JSON objects/arrays",
            code="body_too_complex",
        )
    if elements > max_elements:
        raise ApiError(
            400, f"request body has more than {max_elements} JSON elements", code="body_too_complex"
        )


def parse_inline(raw: bytes, server: ServerConfig) -> dict[str, Any]:
    check_utf8(raw)
    check_shape(raw, server.max_json_containers, server.max_json_elements)
    return parse_json(raw)


async def parse_body(raw: bytes, server: ServerConfig) -> dict[str, Any]:
    """The request body as a JSON object (OpenAI-shaped 400s otherwise), bounded in cost."""
    if len(raw) <= OFF_LOOP_BYTES:
        return parse_inline(raw, server)
    async with _LARGE_PARSES:
        return await asyncio.to_thread(parse_inline, raw, server)


async def parse_features(
    body: dict[str, Any],
    size: int,
    endpoint: str,
    route_header: str | None,
    *,
    allow_override: bool,
) -> ParsedRequest:
    """:func:`~gateway.api.features.parse_request` on a body of ``size`` bytes: inline when
    small, in a worker thread (as :func:`parse_body`) when above ``OFF_LOOP_BYTES``."""
    if size <= OFF_LOOP_BYTES:
        return parse_request(body, endpoint, route_header, allow_override=allow_override)
    async with _LARGE_PARSES:
        return await asyncio.to_thread(
            parse_request, body, endpoint, route_header, allow_override=allow_override
        )
