"""The ext_proc messages the Endpoint Picker reads and writes (Envoy's protobufs).

The protobuf classes come from ``xds-protos`` (Envoy's API as generated Python); this
module is the only one that touches them, and it hands the rest of the EPP plain values.
"""

from __future__ import annotations

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


@dataclass(slots=True)
class Incoming:
    """One ProcessingRequest, flattened."""

    kind: str
    headers: dict[str, str]  # lower-case names; the last value of a repeated name wins
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
            headers[hv.key.lower()] = hv.raw_value.decode("utf-8", "replace") if hv.raw_value else hv.value
        eos = h.end_of_stream
    elif kind in (REQUEST_BODY, RESPONSE_BODY):
        b = getattr(req, kind)
        body, eos = b.body, b.end_of_stream
    elif kind in (REQUEST_TRAILERS, RESPONSE_TRAILERS):
        eos = True
    metadata: dict[str, dict[str, Any]] = {}
    if req.HasField("metadata_context"):
        for ns, st in req.metadata_context.filter_metadata.items():
            metadata[ns] = _struct(st)
    full_duplex = req.HasField("protocol_config") and req.protocol_config.request_body_mode == FULL_DUPLEX
    return Incoming(kind, headers, body, eos, metadata, full_duplex)


def _struct(st: struct_pb2.Struct) -> dict[str, Any]:
    out = MessageToDict(st)
    return out if isinstance(out, dict) else {}


def _header_mutation(set_headers: Mapping[str, str], remove: Iterable[str] = ()) -> pb.HeaderMutation:
    return pb.HeaderMutation(
        set_headers=[
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key=k, raw_value=v.encode()),
                append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
            )
            for k, v in set_headers.items()
        ],
        remove_headers=list(remove),
    )


def _dynamic(endpoints: str, extra: Mapping[str, str]) -> struct_pb2.Struct:
    dm = struct_pb2.Struct()
    dm.update({LB_NAMESPACE: {DESTINATION: endpoints}, "specgate": dict(extra)})
    return dm


CONTINUE_HEADERS = pb.ProcessingResponse(request_headers=pb.HeadersResponse()).SerializeToString()
CONTINUE_BODY = pb.ProcessingResponse(request_body=pb.BodyResponse()).SerializeToString()
CONTINUE_RESPONSE_HEADERS = pb.ProcessingResponse(response_headers=pb.HeadersResponse()).SerializeToString()
CONTINUE_RESPONSE_BODY = pb.ProcessingResponse(response_body=pb.BodyResponse()).SerializeToString()
CONTINUE_TRAILERS = {
    REQUEST_TRAILERS: pb.ProcessingResponse(request_trailers=pb.TrailersResponse()).SerializeToString(),
    RESPONSE_TRAILERS: pb.ProcessingResponse(response_trailers=pb.TrailersResponse()).SerializeToString(),
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
    request, the same endpoints in ``envoy.lb`` dynamic metadata, the body replaced when
    ``body`` is given (``new_length``: it is replaced in a later message). ``phase``: the
    message it answers (request headers or body)."""
    drop = ("content-length", "content-encoding") if body is not None or new_length else ()
    mutation = _header_mutation({DESTINATION: endpoints, **headers}, drop)
    common = pb.CommonResponse(header_mutation=mutation)
    if body is not None:
        common.body_mutation.body = body
    if phase == REQUEST_HEADERS:
        common.clear_route_cache = False
        resp = pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=common))
    else:
        resp = pb.ProcessingResponse(request_body=pb.BodyResponse(response=common))
    resp.dynamic_metadata.CopyFrom(_dynamic(endpoints, tags))
    return bytes(resp.SerializeToString())


def full_duplex_chunk(body: bytes, end: bool) -> bytes:
    """FULL_DUPLEX_STREAMED: a piece of the request body sent back (``end``: the last)."""
    common = pb.CommonResponse()
    common.body_mutation.streamed_response.body = body
    common.body_mutation.streamed_response.end_of_stream = end
    return bytes(pb.ProcessingResponse(request_body=pb.BodyResponse(response=common)).SerializeToString())


def response_headers(headers: Mapping[str, str], *, read_body: bool) -> bytes:
    """Add ``headers`` to the client's response; ``read_body`` switches the response body
    on for this request (streamed to the EPP chunk by chunk: the client's stream is not
    held back)."""
    resp = pb.ProcessingResponse(
        response_headers=pb.HeadersResponse(
            response=pb.CommonResponse(header_mutation=_header_mutation(headers))
        )
    )
    if read_body:
        resp.mode_override.response_body_mode = processing_mode_pb2.ProcessingMode.STREAMED
    return bytes(resp.SerializeToString())


def immediate(err: ApiError, headers: Mapping[str, str]) -> bytes:
    """An OpenAI-shaped error answered by Envoy itself: the request reaches no engine."""
    hdrs = {"content-type": "application/json", **{k.lower(): v for k, v in err.headers.items()}, **headers}
    resp = pb.ProcessingResponse(
        immediate_response=pb.ImmediateResponse(
            status=http_status_pb2.HttpStatus(code=err.status),
            headers=_header_mutation(hdrs),
            body=json.dumps(err.body()).encode(),
            details=f"specgate_{err.code or err.type}"[:64],
        )
    )
    return bytes(resp.SerializeToString())
