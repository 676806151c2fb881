"""Envoy's side of ext_proc in the tests: ProcessingRequests written, ProcessingResponses read.

The inverse of :mod:`gateway.envoy.messages`, written separately on the same wire helpers;
``test_messages.py`` checks both against encodings made by Envoy's generated classes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import grpc

from gateway.envoy.protowire import FIXED64, LEN, VARINT, fields, ld, struct_bytes, struct_value, uint

PROCESS = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
_PHASES = (
    "request_headers",
    "response_headers",
    "request_body",
    "response_body",
    "request_trailers",
    "response_trailers",
)
_REQUEST_FIELD = {name: i + 2 for i, name in enumerate(_PHASES)}
_RESPONSE_PHASE = {i + 1: name for i, name in enumerate(_PHASES)}
BUFFERED, STREAMED, FULL_DUPLEX_STREAMED = 2, 1, 4


# -- requests (Envoy → EPP) -------------------------------------------------------------------


def _header_map(headers: dict[str, str], *, raw: bool = True) -> bytes:
    return ld(
        1, b"".join(ld(1, ld(1, k.encode()) + ld(3 if raw else 2, v.encode())) for k, v in headers.items())
    )


def _metadata(namespaces: dict[str, dict[str, Any]]) -> bytes:
    return ld(8, b"".join(ld(1, ld(1, ns.encode()) + ld(2, struct_bytes(v))) for ns, v in namespaces.items()))


def request_headers(
    path: str = "/v1/chat/completions",
    method: str = "POST",
    headers: dict[str, str] | None = None,
    *,
    eos: bool = False,
    subset: list[str] | None = None,
    full_duplex: bool = False,
    streamed: bool = False,
    without_waiting: bool = False,
) -> bytes:
    """``streamed``: the filter's request body mode is STREAMED (``without_waiting``: with
    send_body_without_waiting_for_header_response); ``full_duplex``: FULL_DUPLEX_STREAMED;
    else BUFFERED."""
    hs = {":path": path, ":method": method, ":authority": "gw", ":scheme": "http", **(headers or {})}
    out = ld(_REQUEST_FIELD["request_headers"], _header_map(hs) + (uint(3, 1) if eos else b""))
    if subset is not None:
        out += _metadata({"envoy.lb.subset_hint": {"x-gateway-destination-endpoint-subset": subset}})
    mode = FULL_DUPLEX_STREAMED if full_duplex else STREAMED if streamed else BUFFERED
    out += ld(11, uint(1, mode) + (uint(3, 1) if without_waiting else b""))
    return out


def request_body(body: dict[str, Any] | bytes, *, eos: bool = True) -> bytes:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return ld(_REQUEST_FIELD["request_body"], ld(1, raw) + (uint(2, 1) if eos else b""))


def response_headers(status: int = 200, served: str | None = None) -> bytes:
    out = ld(_REQUEST_FIELD["response_headers"], _header_map({":status": str(status)}))
    if served is not None:
        out += _metadata({"envoy.lb": {"x-gateway-destination-endpoint-served": served}})
    return out


def response_body(data: bytes, *, eos: bool) -> bytes:
    return ld(_REQUEST_FIELD["response_body"], ld(1, data) + (uint(2, 1) if eos else b""))


# -- responses (EPP → Envoy) ------------------------------------------------------------------


@dataclass
class Response:
    """A ProcessingResponse, read: which phase it answers and what it asks of Envoy."""

    kind: str = ""
    set_headers: dict[str, str] = field(default_factory=dict)
    append_actions: list[int] = field(default_factory=list)
    remove_headers: list[str] = field(default_factory=list)
    body: bytes | None = None  # body_mutation.body
    clear_body: bool = False  # body_mutation.clear_body
    streamed: tuple[bytes, bool] | None = None  # body_mutation.streamed_response
    dynamic_metadata: dict[str, Any] = field(default_factory=dict)
    response_body_mode: int | None = None  # mode_override
    mode: dict[int, int] = field(default_factory=dict)  # mode_override: ProcessingMode field -> value
    status: int | None = None  # immediate_response
    immediate_body: bytes = b""
    details: str = ""


def _mutation(buf: bytes, r: Response) -> None:
    for f, w, v in fields(buf):
        if f == 1 and w == LEN:
            key = value = ""
            for of, ow, ov in fields(v):
                if of == 1 and ow == LEN:
                    for hf, _hw, hv in fields(ov):
                        if hf == 1:
                            key = hv.decode()
                        elif hf in (2, 3):
                            value = hv.decode()
                elif of == 3 and ow == VARINT:
                    r.append_actions.append(ov)
            r.set_headers[key] = value
        elif f == 2 and w == LEN:
            r.remove_headers.append(v.decode())


def parse_response(message: bytes) -> Response:
    r = Response()
    for num, wire, value in fields(message):
        if num in _RESPONSE_PHASE and wire == LEN:
            r.kind = _RESPONSE_PHASE[num]
            for f, w, common in fields(value):
                if f == 1 and w == LEN:  # CommonResponse (or TrailersResponse.header_mutation)
                    for cf, cw, cv in fields(common):
                        if cf == 2 and cw == LEN:
                            _mutation(cv, r)
                        elif cf == 3 and cw == LEN:
                            for bf, bw, bv in fields(cv):
                                if bf == 1 and bw == LEN:
                                    r.body = bv
                                elif bf == 2 and bw == VARINT:
                                    r.clear_body = bool(bv)
                                elif bf == 3 and bw == LEN:
                                    body, end = b"", False
                                    for sf, _sw, sv in fields(bv):
                                        if sf == 1:
                                            body = sv
                                        elif sf == 2:
                                            end = bool(sv)
                                    r.streamed = (body, end)
        elif num == 7 and wire == LEN:
            r.kind = "immediate_response"
            for f, w, v in fields(value):
                if f == 1 and w == LEN:
                    r.status = next(sv for sf, _sw, sv in fields(v) if sf == 1)
                elif f == 2 and w == LEN:
                    _mutation(v, r)
                elif f == 3 and w == LEN:
                    r.immediate_body = v
                elif f == 5 and w == LEN:
                    r.details = v.decode()
        elif num == 8 and wire == LEN:
            r.dynamic_metadata = struct_value(value)
        elif num == 9 and wire == LEN:
            for f, w, v in fields(value):
                if w == VARINT:
                    r.mode[f] = v
                if f == 4 and w == VARINT:
                    r.response_body_mode = v
        elif wire not in (VARINT, LEN, FIXED64):
            raise AssertionError(f"unexpected field {num}")
    return r


def process_call(channel: grpc.aio.Channel) -> Any:
    """A raw ``ExternalProcessor/Process`` call (messages as bytes)."""
    return channel.stream_stream(PROCESS, request_serializer=None, response_deserializer=None)()


# -- the access log (Envoy → EPP) -------------------------------------------------------------

ACCESS_LOG = "/envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs"


def _duration(seconds: float) -> bytes:
    whole = int(seconds)
    return uint(1, whole) + uint(2, round((seconds - whole) * 1e9))


def log_entry(
    request_id: str,
    status: int = 200,
    upstream: str = "",
    *,
    duration_s: float = 0.25,
    flags: tuple[int, ...] = (),
    details: str = "via_upstream",
    intermediate: bool = False,
) -> bytes:
    """An ``HTTPAccessLogEntry``: ``flags`` are ResponseFlags' field numbers set."""
    common = ld(12, _duration(duration_s))
    if upstream:
        host, _, port = upstream.rpartition(":")
        common += ld(13, ld(1, ld(2, host.encode()) + uint(3, int(port))))
    if flags:
        common += ld(16, b"".join(uint(f, 1) for f in flags))
    common += uint(33, 5 if intermediate else 6)  # access_log_type: DownstreamPeriodic, DownstreamEnd
    response = (ld(1, uint(1, status)) if status else b"") + ld(6, details.encode())
    return ld(1, common) + ld(3, ld(9, request_id.encode())) + ld(4, response)


def access_log_message(*entries: bytes, identifier: bool = False) -> bytes:
    """A ``StreamAccessLogsMessage`` (``identifier``: with the log name, as Envoy's first)."""
    head = ld(1, ld(2, b"specgate")) if identifier else b""
    return head + (ld(2, b"".join(ld(1, e) for e in entries)) if entries else b"")


def access_log_call(channel: grpc.aio.Channel) -> Any:
    """A raw ``AccessLogService/StreamAccessLogs`` call (messages as bytes)."""
    return channel.stream_unary(ACCESS_LOG, request_serializer=None, response_deserializer=None)()
