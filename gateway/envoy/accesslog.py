"""Envoy's gRPC access log (ALS), the little of it the Endpoint Picker reads.

Envoy's ``envoy.access_loggers.http_grpc`` logger streams one ``HTTPAccessLogEntry`` per
request, in batches, on the client-streaming call ``AccessLogService/StreamAccessLogs``
(``envoy/service/accesslog/v3/als.proto``; the entries are
``envoy/data/accesslog/v3/accesslog.proto``). Each entry comes once the request is over,
the response's last byte sent or the stream reset: the one message that tells the EPP how
every request ended, whatever the ext_proc processing mode showed it of the response.

Read here: the request's ``x-request-id``, the status Envoy answered with, the upstream
address that served it, the time to the last byte sent, and the flags that name a reset.
Field numbers are those of the protos above (``fixtures/access_log_golden.json`` in the tests
holds entries real Envoy wrote).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from gateway.envoy.filters import EPP_CLUSTER, duration, typed
from gateway.envoy.protowire import LEN, fields, index

PATH = "/envoy.service.accesslog.v3.AccessLogService/StreamAccessLogs"
LOG_NAME = "specgate"
# The empty StreamAccessLogsResponse, answered when Envoy closes its side (it seldom does).
EMPTY_RESPONSE = b""

# StreamAccessLogsMessage{identifier = 1, http_logs = 2 HTTPAccessLogEntries{log_entry = 1}}
_HTTP_LOGS = 2
# HTTPAccessLogEntry{common_properties = 1, request = 3, response = 4}
_COMMON, _REQUEST, _RESPONSE = 1, 3, 4
# AccessLogCommon
_LAST_DOWNSTREAM_TX, _UPSTREAM_REMOTE = 12, 13
_FLAGS, _DURATION = 16, 23
# intermediate_log_entry (deprecated) and access_log_type: an entry ends its request where it
# is not intermediate and its type is NotSet (older Envoys) or DownstreamEnd
_INTERMEDIATE, _LOG_TYPE = 27, 33
_END_TYPES = frozenset({0, 6})
_REQUEST_ID = 9  # HTTPRequestProperties.request_id
_CODE, _CODE_DETAILS = 1, 6  # HTTPResponseProperties.response_code (UInt32Value), details

# ResponseFlags' booleans, by field number, as the error a request that ended so is counted
# with (the first set, in this order).
_FLAG_ERRORS = (
    (15, "client_disconnected"),  # downstream_connection_termination
    (3, "upstream_timeout"),  # upstream_request_timeout
    (17, "stream_idle_timeout"),
    (6, "upstream_unavailable"),  # upstream_connection_failure
    (2, "upstream_unavailable"),  # no_healthy_upstream
    (8, "upstream_overflow"),
    (5, "upstream_reset"),  # upstream_remote_reset
    (7, "upstream_reset"),  # upstream_connection_termination
    (24, "upstream_protocol_error"),
    (4, "local_reset"),
    (26, "overload_manager"),
)


class LogEntry(NamedTuple):
    """One request as Envoy logged it once it was over."""

    request_id: str
    status: int  # the status Envoy answered with (0: none sent, the stream was reset first)
    upstream: str  # ip:port of the endpoint that served it ("" where none did)
    duration_s: float | None  # first byte received to last byte sent
    error: str | None  # what ended it, from Envoy's response flags (None: nothing did)
    details: str  # Envoy's response code details ("via_upstream": the engine answered)
    intermediate: bool  # not the request's end (a periodic entry of a stream still running...)


# the LEN fields read of the small messages below (their VARINTs are always read)
_NONE: frozenset[int] = frozenset()  # only VARINTs
_FIRST = frozenset({1})
_HOST = frozenset({2})


def _duration(buf: bytes | None) -> float | None:
    """A ``google.protobuf.Duration`` in seconds."""
    if buf is None:
        return None
    d = index(buf, _NONE)  # Duration{seconds = 1, nanos = 2}: VARINTs
    seconds, nanos = d.get(1, 0), d.get(2, 0)
    return (seconds if isinstance(seconds, int) else 0) + (nanos if isinstance(nanos, int) else 0) / 1e9


def _address(buf: bytes) -> str:
    """``config.core.v3.Address``'s socket address as ``ip:port`` ("" for any other kind)."""
    sock = index(buf, _FIRST).get(1)  # SocketAddress{address = 2, port_value = 3}
    if not isinstance(sock, bytes):
        return ""
    a = index(sock, _HOST)
    host, port = a.get(2), a.get(3, 0)
    if not isinstance(host, bytes) or not host or not isinstance(port, int):
        return ""
    text = host.decode("utf-8", "replace")
    return f"[{text}]:{port}" if ":" in text else f"{text}:{port}"


def _flag_error(buf: bytes) -> str | None:
    flags = index(buf, _NONE)  # booleans: VARINTs
    for f, error in _FLAG_ERRORS:
        if flags.get(f):
            return error
    return None


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else ""


def _len(value: Any) -> bytes | None:
    return value if isinstance(value, bytes) else None


_ENTRY_FIELDS = frozenset({_COMMON, _REQUEST, _RESPONSE})
_COMMON_FIELDS = frozenset({_LAST_DOWNSTREAM_TX, _UPSTREAM_REMOTE, _FLAGS, _DURATION})
_REQUEST_FIELDS = frozenset({_REQUEST_ID})
_RESPONSE_FIELDS = frozenset({_CODE, _CODE_DETAILS})


def _entry(buf: bytes) -> LogEntry:
    e = index(buf, _ENTRY_FIELDS)
    common = index(_len(e.get(_COMMON)) or b"", _COMMON_FIELDS)
    request = index(_len(e.get(_REQUEST)) or b"", _REQUEST_FIELDS)
    response = index(_len(e.get(_RESPONSE)) or b"", _RESPONSE_FIELDS)
    code = _len(response.get(_CODE))
    status = index(code, _NONE).get(1, 0) if code else 0  # UInt32Value{value = 1}
    last = _duration(_len(common.get(_LAST_DOWNSTREAM_TX)))
    upstream = _len(common.get(_UPSTREAM_REMOTE))
    flags = _len(common.get(_FLAGS))
    return LogEntry(
        request_id=_text(request.get(_REQUEST_ID)),
        status=status if isinstance(status, int) else 0,
        upstream=_address(upstream) if upstream else "",
        # to the last byte sent, as the proxy times a request; the stream's whole life where none was
        duration_s=last if last is not None else _duration(_len(common.get(_DURATION))),
        error=_flag_error(flags) if flags else None,
        details=_text(response.get(_CODE_DETAILS)),
        intermediate=bool(common.get(_INTERMEDIATE)) or common.get(_LOG_TYPE, 0) not in _END_TYPES,
    )


def split_logs(message: bytes) -> list[bytes]:
    """The HTTP entries of a ``StreamAccessLogsMessage``, each still encoded (raises
    :class:`~gateway.envoy.protowire.ProtoError`); TCP entries are skipped."""
    out: list[bytes] = []
    for f, w, v in fields(message):
        if f == _HTTP_LOGS and w == LEN:
            out.extend(ev for ef, ew, ev in fields(v) if ef == 1 and ew == LEN)
    return out


def parse_entry(raw: bytes) -> LogEntry:
    """One encoded ``HTTPAccessLogEntry`` (raises :class:`~gateway.envoy.protowire.ProtoError`)."""
    return _entry(raw)


def parse_logs(message: bytes) -> list[LogEntry]:
    """The HTTP entries of a ``StreamAccessLogsMessage``, read."""
    return [_entry(raw) for raw in split_logs(message)]


def grpc_access_log(*, flush_s: float) -> dict[str, Any]:
    """The connection manager's access logger that streams every request's entry to the
    EPP (its cluster), batched for at most ``flush_s``."""
    return {
        "name": "envoy.access_loggers.http_grpc",
        "typed_config": typed(
            "extensions.access_loggers.grpc.v3.HttpGrpcAccessLogConfig",
            common_config={
                "log_name": LOG_NAME,
                "transport_api_version": "V3",
                "grpc_service": {"envoy_grpc": {"cluster_name": EPP_CLUSTER}},
                "buffer_flush_interval": duration(flush_s),
            },
        ),
    }
