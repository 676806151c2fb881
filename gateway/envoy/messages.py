"""The ext_proc messages the Endpoint Picker reads and writes.

Reading: a ``ProcessingRequest`` flattened into :class:`Incoming` (which phase, the request
headers the EPP uses, the body, Envoy's metadata). Writing: the few ``ProcessingResponse``
shapes the EPP answers with. Both go through :mod:`.protowire`; field numbers are those of
Envoy's ``envoy/service/ext_proc/v3/external_processor.proto`` (v3, the one the Endpoint
Picker protocol names) and its imports, given by name below.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.envoy.protowire import (
    FIXED64,
    LEN,
    VARINT,
    ProtoError,
    fields,
    ld,
    read_varint,
    struct_bytes,
    struct_value,
    uint,
)
from gateway.wire.errors import ApiError

DESTINATION = "x-gateway-destination-endpoint"
SERVED = "x-gateway-destination-endpoint-served"
SUBSET = "x-gateway-destination-endpoint-subset"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"

# ProcessingRequest / ProcessingResponse: the phase's field number. The request numbers its
# phases from 2, the response from 1.
REQUEST_HEADERS = "request_headers"
RESPONSE_HEADERS = "response_headers"
REQUEST_BODY = "request_body"
RESPONSE_BODY = "response_body"
REQUEST_TRAILERS = "request_trailers"
RESPONSE_TRAILERS = "response_trailers"
PHASES = (REQUEST_HEADERS, RESPONSE_HEADERS, REQUEST_BODY, RESPONSE_BODY, REQUEST_TRAILERS, RESPONSE_TRAILERS)
_IN_PHASE = {i + 2: name for i, name in enumerate(PHASES)}
_OUT_PHASE = {name: i + 1 for i, name in enumerate(PHASES)}
_IN_METADATA, _IN_PROTOCOL = 8, 11  # ProcessingRequest.metadata_context, .protocol_config
_OUT_IMMEDIATE, _OUT_DYNAMIC, _OUT_MODE = 7, 8, 9  # ProcessingResponse fields

# ProcessingMode.BodySendMode and HeaderSendMode
STREAMED, BUFFERED, FULL_DUPLEX_STREAMED = 1, 2, 4
_SEND, _SKIP = 1, 2
# ProcessingMode{request_header_mode = 1, response_header_mode = 2, request_body_mode = 3,
# response_body_mode = 4, request_trailer_mode = 5, response_trailer_mode = 6}
_MODE_RESPONSE_BODY = 4

# The request headers the EPP reads (the rest pass through Envoy untouched).
WANTED = frozenset(
    {
        ":path",
        ":method",
        ":status",
        "content-length",
        "content-encoding",
        "x-request-id",
        "authorization",
        "x-specgate-route",
        "traceparent",
        "tracestate",
        "baggage",
    }
)


@dataclass(slots=True)
class Incoming:
    """One ProcessingRequest, flattened."""

    kind: str = ""
    headers: dict[str, str] = field(default_factory=dict)  # the WANTED ones, lower-case
    body: bytes = b""
    end_of_stream: bool = False
    metadata: dict[str, dict[str, Any]] = field(default_factory=dict)  # namespace → fields
    body_mode: int = BUFFERED  # the filter's request_body_mode (ProtocolConfiguration)
    # ProtocolConfiguration.send_body_without_waiting_for_header_response (STREAMED): the body
    # comes before the headers are answered
    body_without_waiting: bool = False

    @property
    def full_duplex(self) -> bool:
        """The filter streams the request body both ways."""
        return self.body_mode == FULL_DUPLEX_STREAMED


def parse(message: bytes) -> Incoming:
    """Decode a ProcessingRequest (raises :class:`~gateway.envoy.protowire.ProtoError`)."""
    inc = Incoming()
    for num, wire, value in _fields(message):
        if wire != LEN:
            continue
        kind = _IN_PHASE.get(num)
        if kind is not None:
            inc.kind = kind
            if kind in (REQUEST_HEADERS, RESPONSE_HEADERS):
                _headers(value, inc)  # HttpHeaders{headers = 1 HeaderMap, end_of_stream = 3}
            elif kind in (REQUEST_BODY, RESPONSE_BODY):
                for f, w, v in _fields(value):  # HttpBody{body = 1, end_of_stream = 2}
                    if f == 1 and w == LEN:
                        inc.body = v
                    elif f == 2 and w == VARINT:
                        inc.end_of_stream = bool(v)
            else:
                inc.end_of_stream = True
        elif num == _IN_METADATA:  # Metadata{filter_metadata = 1: map<string, Struct>}
            for f, w, entry in fields(value):
                if f == 1 and w == LEN:
                    ns, st = "", b""
                    for ef, ew, ev in fields(entry):
                        if ef == 1 and ew == LEN:
                            ns = ev.decode("utf-8", "replace")
                        elif ef == 2 and ew == LEN:
                            st = ev
                    inc.metadata[ns] = struct_value(st)
        elif num == _IN_PROTOCOL:
            # ProtocolConfiguration{request_body_mode = 1, send_body_without_waiting_for_header_response = 3}
            for f, w, v in _fields(value):
                if f == 1 and w == VARINT:
                    inc.body_mode = v
                elif f == 3 and w == VARINT:
                    inc.body_without_waiting = bool(v)
    return inc


def _headers(buf: bytes, inc: Incoming) -> None:
    for f, w, v in _fields(buf):
        if f == 1 and w == LEN:  # HeaderMap{headers = 1: HeaderValue{key = 1, value = 2, raw_value = 3}}
            _header_map(v, inc.headers)
        elif f == 3 and w == VARINT:
            inc.end_of_stream = bool(v)


def _fields(buf: bytes) -> list[tuple[int, int, Any]]:
    """:func:`~gateway.envoy.protowire.fields` as a list, read without a generator: the
    one-byte tags of LEN and VARINT fields (all the fields of what Envoy sends) here, any
    other from there on by the general reader."""
    out: list[tuple[int, int, Any]] = []
    pos, n = 0, len(buf)
    while pos < n:
        key = buf[pos]
        wire = key & 7
        if key >= 0x80 or key < 8 or wire > LEN or wire == FIXED64 or pos + 1 >= n:
            out.extend(fields(buf[pos:]))  # the rest as the general reader reads it
            return out
        value = buf[pos + 1]
        if value < 0x80:
            pos += 2
        else:
            value, pos = read_varint(buf, pos + 1)
        if wire == LEN:
            end = pos + value
            if end > n:
                raise ProtoError("truncated length-delimited field")
            out.append((key >> 3, LEN, buf[pos:end]))
            pos = end
        else:
            out.append((key >> 3, VARINT, value))
    return out


def _len(buf: bytes, pos: int) -> tuple[int, int]:
    """A length prefix at ``pos`` (one byte in the common case): (length, next position)."""
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    return read_varint(buf, pos)


_WANTED_KEYS = {k.encode(): k for k in WANTED}


def _header_map(buf: bytes, out: dict[str, str]) -> None:
    """The WANTED headers of a HeaderMap's encoding, read in one pass (the hot loop of the
    EPP's parsing: a request has a dozen headers or more); the values of the others are
    not decoded."""
    pos, n = 0, len(buf)
    wanted = _WANTED_KEYS
    while pos < n:
        tag = buf[pos]
        length, pos = _len(buf, pos + 1)
        end = pos + length
        if end > n:
            raise ProtoError("truncated HeaderMap")
        if tag != 0x0A:  # not field 1 as LEN (an unknown field): skipped
            if tag & 7 != LEN:
                raise ProtoError("unexpected field in HeaderMap")
            pos = end
            continue
        key = value = b""
        while pos < end:  # HeaderValue{key = 1, value = 2, raw_value = 3}, all LEN
            vtag = buf[pos]
            vlen, pos = _len(buf, pos + 1)
            vend = pos + vlen
            if vend > end or vtag & 7 != LEN:
                raise ProtoError("malformed HeaderValue")
            if vtag == 0x0A:
                key = buf[pos:vend]
            elif vlen and (vtag == 0x1A or vtag == 0x12):
                value = buf[pos:vend]
            pos = vend
        # Envoy sends names in lower case (HTTP/2); latin-1 has no other letters that
        # lower-case to ASCII, so the bytes' lower() finds the same names the text's would.
        name = wanted.get(key) or wanted.get(key.lower())
        if name is not None:
            out[name] = value.decode("utf-8", "replace")


# -- writing -------------------------------------------------------------------------------
# CommonResponse{header_mutation = 2, body_mutation = 3}; HeaderMutation{set_headers = 1,
# remove_headers = 2}; HeaderValueOption{header = 1, append_action = 3};
# BodyMutation{body = 1, streamed_response = 3}; StreamedBodyResponse{body = 1, end_of_stream = 2};
# HeadersResponse / BodyResponse{response = 1}; ImmediateResponse{status = 1 HttpStatus{code = 1},
# headers = 2, body = 3, details = 5}.
_OVERWRITE_IF_EXISTS_OR_ADD = 2
_ACTION = uint(3, _OVERWRITE_IF_EXISTS_OR_ADD)


@functools.lru_cache(maxsize=256)
def _key(key: str) -> bytes:
    return ld(1, key.encode())


def _header_option(key: str, value: str) -> bytes:
    return ld(1, ld(1, _key(key) + ld(3, value.encode())) + _ACTION)


# Headers whose values repeat (endpoints, routes, reasons, engines): their encoding is kept.
_REPEATING = frozenset({DESTINATION, "x-specgate-route", "x-specgate-reason", "x-specgate-engine"})
_cached_option = functools.lru_cache(maxsize=4096)(_header_option)


def header_mutation(set_headers: Mapping[str, str], remove: Iterable[str] = ()) -> bytes:
    """A HeaderMutation's fields: set (overwrite or add) ``set_headers``, remove ``remove``."""
    out = b"".join(
        [(_cached_option if k in _REPEATING else _header_option)(k, v) for k, v in set_headers.items()]
    )
    if not remove:
        return out
    return out + (_removals(remove) if type(remove) is tuple else b"".join(ld(2, r.encode()) for r in remove))


@functools.lru_cache(maxsize=64)
def _removals(remove: tuple[str, ...]) -> bytes:
    return b"".join(ld(2, r.encode()) for r in remove)


@functools.lru_cache(maxsize=1024)  # endpoints × routes × reasons: few distinct values
def _dynamic(endpoints: str, route: str, reason: str, engine: str) -> bytes:
    tags = {"route": route, "reason": reason}
    if engine:
        tags["engine"] = engine
    return ld(_OUT_DYNAMIC, struct_bytes({LB_NAMESPACE: {DESTINATION: endpoints}, "specgate": tags}))


_LENGTH_HEADERS = ("content-length", "content-encoding")  # dropped where the body is replaced
CONTINUE = {name: ld(_OUT_PHASE[name], b"") for name in PHASES}
CONTINUE_HEADERS = CONTINUE[REQUEST_HEADERS]
CONTINUE_BODY = CONTINUE[REQUEST_BODY]
CONTINUE_RESPONSE_HEADERS = CONTINUE[RESPONSE_HEADERS]
CONTINUE_RESPONSE_BODY = CONTINUE[RESPONSE_BODY]
CONTINUE_TRAILERS = {name: CONTINUE[name] for name in (REQUEST_TRAILERS, RESPONSE_TRAILERS)}


def routed(
    phase: str,
    endpoints: str,
    headers: Mapping[str, str],
    body: bytes | None,
    tags: Mapping[str, str],
    *,
    new_length: bool = False,
) -> bytes:
    """The answer that routes the request: the destination header (plus ``headers``) on the
    request, the same endpoints in ``envoy.lb`` dynamic metadata (and the route under
    ``specgate``), the body replaced when ``body`` is given (``new_length``: it is replaced
    in a later message). ``phase``: the message it answers (request headers or body)."""
    drop = _LENGTH_HEADERS if body is not None or new_length else ()
    if DESTINATION in headers:
        mutation = header_mutation({DESTINATION: endpoints, **headers}, drop)
    else:  # the destination first, then the others (as the merged mapping would order them)
        mutation = _cached_option(DESTINATION, endpoints) + header_mutation(headers, drop)
    common = ld(2, mutation)
    if body is not None:
        common += ld(3, ld(1, body))
    dynamic = _dynamic(endpoints, tags.get("route", ""), tags.get("reason", ""), tags.get("engine", ""))
    return ld(_OUT_PHASE[phase], ld(1, common)) + dynamic


def full_duplex_chunk(body: bytes, end: bool) -> bytes:
    """FULL_DUPLEX_STREAMED: a piece of the request body sent back (``end``: the last)."""
    streamed = ld(1, body) + (uint(2, 1) if end else b"")
    return ld(_OUT_PHASE[REQUEST_BODY], ld(1, ld(3, ld(3, streamed))))


_READ_BODY = ld(_OUT_MODE, uint(_MODE_RESPONSE_BODY, STREAMED))


@functools.lru_cache(maxsize=8)
def watch_response(body_mode: int = BUFFERED) -> bytes:
    """A ``mode_override`` (appended to the answer to the request headers: Envoy honours one
    there, not in the answer to a body) that asks for this request's response headers,
    whatever the filter's configured mode. It restates the request's own modes: headers
    sent, the body as the filter sends it (``body_mode``), trailers skipped."""
    mode = uint(1, _SEND) + uint(2, _SEND) + uint(3, body_mode) + uint(5, _SKIP) + uint(6, _SKIP)
    return ld(_OUT_MODE, mode)


def continue_headers(*, watch: bool, body_mode: int = BUFFERED) -> bytes:
    """The answer to the request headers before the body (``watch``: see :func:`watch_response`)."""
    return CONTINUE_HEADERS + watch_response(body_mode) if watch else CONTINUE_HEADERS


_CLEAR_BODY = ld(_OUT_PHASE[REQUEST_BODY], ld(1, ld(3, uint(2, 1))))


def body_chunk(body: bytes | None, *, clear: bool = False) -> bytes:
    """STREAMED: the answer to one piece of the request body, which passes as it is, is
    replaced by ``body``, or (``clear``) is dropped. BodyMutation{body = 1, clear_body = 2}."""
    if body is not None:
        return ld(_OUT_PHASE[REQUEST_BODY], ld(1, ld(3, ld(1, body))))
    return _CLEAR_BODY if clear else CONTINUE_BODY


def response_headers(headers: Mapping[str, str], *, read_body: bool) -> bytes:
    """Add ``headers`` to the client's response; ``read_body`` switches the response body
    on for this request (streamed to the EPP chunk by chunk: the client's stream is not
    held back)."""
    out = ld(_OUT_PHASE[RESPONSE_HEADERS], ld(1, ld(2, header_mutation(headers))))
    return out + _READ_BODY if read_body else out


def immediate(err: ApiError, headers: Mapping[str, str]) -> bytes:
    """An OpenAI-shaped error answered by Envoy itself: the request reaches no engine."""
    hdrs = {"content-type": "application/json", **{k.lower(): v for k, v in err.headers.items()}, **headers}
    details = f"specgate_{err.code or err.type}"[:64]
    ir = (
        ld(1, uint(1, err.status))
        + ld(2, header_mutation(hdrs))
        + ld(3, json.dumps(err.body()).encode())
        + ld(5, details.encode())
    )
    return ld(_OUT_IMMEDIATE, ir)
