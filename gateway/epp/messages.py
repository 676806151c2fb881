"""The ext_proc messages the Endpoint Picker reads and writes (Envoy's protobufs).

The protobuf classes come from ``xds-protos`` (Envoy's API as generated Python); this
module is the only one that touches them, and it hands the rest of the EPP plain values.
The answers on the request path are written field by field (protobuf's wire format is a
concatenation of fields): building them as protobuf objects cost more than the whole
routing decision. Field numbers are read from the generated descriptors, and the tests
parse every answer back with the generated classes.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2
from google.protobuf.json_format import MessageToDict

from gateway.wire.errors import ApiError

DESTINATION = "x-gateway-destination-endpoint"
SERVED = "x-gateway-destination-endpoint-served"
SUBSET = "x-gateway-destination-endpoint-subset"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"

# ProcessingRequest's oneof names
REQUEST_HEADERS = "request_headers"
REQUEST_BODY = "request_body"
RESPONSE_HEADERS = "response_headers"
RESPONSE_BODY = "response_body"
REQUEST_TRAILERS = "request_trailers"
RESPONSE_TRAILERS = "response_trailers"

FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED

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

    kind: str
    headers: dict[str, str]  # the WANTED ones, lower-case; the last of a repeated name wins
    body: bytes
    end_of_stream: bool
    metadata: dict[str, dict[str, Any]]  # filter metadata, namespace → fields
    full_duplex: bool  # the filter streams the request body both ways (FULL_DUPLEX_STREAMED)


def parse(message: bytes) -> Incoming:
    """Decode a ProcessingRequest (raises ``google.protobuf.message.DecodeError``)."""
    req = pb.ProcessingRequest.FromString(message)
    kind = req.WhichOneof("request") or ""
    headers: dict[str, str] = {}
    body = b""
    eos = False
    if kind in (REQUEST_HEADERS, RESPONSE_HEADERS):
        h = getattr(req, kind)
        for hv in h.headers.headers:
            key = hv.key.lower()
            if key in WANTED:
                raw = hv.raw_value
                headers[key] = raw.decode("utf-8", "replace") if raw else hv.value
        eos = h.end_of_stream
    elif kind in (REQUEST_BODY, RESPONSE_BODY):
        b = getattr(req, kind)
        body, eos = b.body, b.end_of_stream
    elif kind in (REQUEST_TRAILERS, RESPONSE_TRAILERS):
        eos = True
    metadata: dict[str, dict[str, Any]] = {}
    fm = req.metadata_context.filter_metadata
    if fm:
        for ns, st in fm.items():
            out = MessageToDict(st)
            metadata[ns] = out if isinstance(out, dict) else {}
    full_duplex = req.protocol_config.request_body_mode == FULL_DUPLEX
    return Incoming(kind, headers, body, eos, metadata, full_duplex)


# -- writing -------------------------------------------------------------------------------


def _num(cls: Any, name: str) -> int:
    return int(cls.DESCRIPTOR.fields_by_name[name].number)


_PR = pb.ProcessingResponse
_F_REQ_HEADERS = _num(_PR, "request_headers")
_F_RESP_HEADERS = _num(_PR, "response_headers")
_F_REQ_BODY = _num(_PR, "request_body")
_F_RESP_BODY = _num(_PR, "response_body")
_F_REQ_TRAILERS = _num(_PR, "request_trailers")
_F_RESP_TRAILERS = _num(_PR, "response_trailers")
_F_DYNAMIC = _num(_PR, "dynamic_metadata")
_F_MODE = _num(_PR, "mode_override")
_F_RESPONSE = _num(pb.HeadersResponse, "response")
assert _num(pb.BodyResponse, "response") == _F_RESPONSE
_F_MUTATION = _num(pb.CommonResponse, "header_mutation")
_F_BODY_MUTATION = _num(pb.CommonResponse, "body_mutation")
_F_SET = _num(pb.HeaderMutation, "set_headers")
_F_REMOVE = _num(pb.HeaderMutation, "remove_headers")
_F_BODY = _num(pb.BodyMutation, "body")
_F_HEADER = _num(base_pb2.HeaderValueOption, "header")
_F_ACTION = _num(base_pb2.HeaderValueOption, "append_action")
_F_KEY = _num(base_pb2.HeaderValue, "key")
_F_RAW = _num(base_pb2.HeaderValue, "raw_value")


_SMALL = [bytes((i,)) for i in range(128)]


def _varint(n: int) -> bytes:
    if n < 128:
        return _SMALL[n]
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _ld(field: int, payload: bytes) -> bytes:
    """A length-delimited field: a sub-message, a string or bytes (field numbers < 16)."""
    n = len(payload)
    return _SMALL[field << 3 | 2] + (_SMALL[n] if n < 128 else _varint(n)) + payload


_ACTION = _varint(_F_ACTION << 3) + _varint(int(base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD))


@functools.lru_cache(maxsize=256)
def _key(key: str) -> bytes:
    return _ld(_F_KEY, key.encode())


def _header_option(key: str, value: str) -> bytes:
    hv = _key(key) + _ld(_F_RAW, value.encode())
    return _ld(_F_SET, _ld(_F_HEADER, hv) + _ACTION)


def _header_mutation(set_headers: Mapping[str, str], remove: Iterable[str] = ()) -> bytes:
    """A HeaderMutation's fields: set (overwrite or add) ``set_headers``, remove ``remove``."""
    out = b"".join(_header_option(k, v) for k, v in set_headers.items())
    return out + b"".join(_ld(_F_REMOVE, r.encode()) for r in remove)


@functools.lru_cache(maxsize=1024)  # endpoints × routes × reasons: few distinct values
def _dynamic(endpoints: str, route: str, reason: str, engine: str) -> bytes:
    dm = struct_pb2.Struct()
    tags = {"route": route, "reason": reason}
    if engine:
        tags["engine"] = engine
    dm.update({LB_NAMESPACE: {DESTINATION: endpoints}, "specgate": tags})
    return _ld(_F_DYNAMIC, bytes(dm.SerializeToString()))


CONTINUE_HEADERS = _ld(_F_REQ_HEADERS, b"")
CONTINUE_BODY = _ld(_F_REQ_BODY, b"")
CONTINUE_RESPONSE_HEADERS = _ld(_F_RESP_HEADERS, b"")
CONTINUE_RESPONSE_BODY = _ld(_F_RESP_BODY, b"")
CONTINUE_TRAILERS = {
    REQUEST_TRAILERS: _ld(_F_REQ_TRAILERS, b""),
    RESPONSE_TRAILERS: _ld(_F_RESP_TRAILERS, b""),
}


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
    drop = ("content-length", "content-encoding") if body is not None or new_length else ()
    common = _ld(_F_MUTATION, _header_mutation({DESTINATION: endpoints, **headers}, drop))
    if body is not None:
        common += _ld(_F_BODY_MUTATION, _ld(_F_BODY, body))
    field = _F_REQ_HEADERS if phase == REQUEST_HEADERS else _F_REQ_BODY
    dynamic = _dynamic(endpoints, tags.get("route", ""), tags.get("reason", ""), tags.get("engine", ""))
    return _ld(field, _ld(_F_RESPONSE, common)) + dynamic


def full_duplex_chunk(body: bytes, end: bool) -> bytes:
    """FULL_DUPLEX_STREAMED: a piece of the request body sent back (``end``: the last)."""
    common = pb.CommonResponse()
    common.body_mutation.streamed_response.body = body
    common.body_mutation.streamed_response.end_of_stream = end
    return bytes(pb.ProcessingResponse(request_body=pb.BodyResponse(response=common)).SerializeToString())


_READ_BODY = _ld(
    _F_MODE,
    bytes(
        processing_mode_pb2.ProcessingMode(
            response_body_mode=processing_mode_pb2.ProcessingMode.STREAMED
        ).SerializeToString()
    ),
)


def response_headers(headers: Mapping[str, str], *, read_body: bool) -> bytes:
    """Add ``headers`` to the client's response; ``read_body`` switches the response body
    on for this request (streamed to the EPP chunk by chunk: the client's stream is not
    held back)."""
    out = _ld(_F_RESP_HEADERS, _ld(_F_RESPONSE, _ld(_F_MUTATION, _header_mutation(headers))))
    return out + _READ_BODY if read_body else out


def immediate(err: ApiError, headers: Mapping[str, str]) -> bytes:
    """An OpenAI-shaped error answered by Envoy itself: the request reaches no engine."""
    hdrs = {"content-type": "application/json", **{k.lower(): v for k, v in err.headers.items()}, **headers}
    resp = pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=err.status),
            headers=pb.HeaderMutation.FromString(_header_mutation(hdrs)),
            body=json.dumps(err.body()).encode(),
            details=f"specgate_{err.code or err.type}"[:64],
        )
    )
    return bytes(resp.SerializeToString())
