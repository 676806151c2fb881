"""The bootstrap's ``ext_proc`` filters, and how requests are shared between them.

Two layouts (``specgate envoy-config --watch-share``):

- **watched** (the default): one filter. Envoy sends the request headers, waits for
  specgate's answer, then sends the whole (BUFFERED) body: two round trips to specgate per
  request. Mode overrides are allowed, so specgate asks for the response headers of the
  answers it watches and the body of a sampled few (``epp.observe_per_s``).
- **split** (a share given): a share of the requests, drawn per request by a route's
  runtime fraction, takes that filter; the others take a second one that sends the body
  without waiting for the headers' answer (STREAMED with
  ``send_body_without_waiting_for_header_response``), so specgate answers both at once:
  one round trip, and no response phase (Envoy ignores mode overrides there, so these
  answers cannot be watched, and Envoy ends their streams once the request is answered:
  their slots go at routing). Each route disables the other route's filter. Neither
  filter is named ``envoy.filters.http.ext_proc``: Envoy would fall back to per-route
  config under that extension name for both. On the one-trip route Envoy's buffer filter
  takes the whole body first, as the watched path's BUFFERED mode does: the headers' answer
  waits for the body's end there, and a slow upload would otherwise run out the filter's
  message timeout (a 504 blamed on specgate). Its limit leaves room above
  ``server.max_body_bytes`` (``BUFFER_SLACK``) so that specgate refuses a body over the
  limit in OpenAI's form; one beyond the slack gets Envoy's own 413.

Envoy draws the fraction from the stream's id, so a route matched again after a header
mutation is the same route.
"""

from __future__ import annotations

from typing import Any

from gateway.envoy.messages import WANTED

LB_NAMESPACE = "envoy.lb"
# specgate's own dynamic metadata (its route and reason), for the access log.
SPECGATE_NAMESPACE = "specgate"
EPP_CLUSTER = "specgate_epp"
EXT_PROC = "envoy.filters.http.ext_proc"  # the one filter of the watched layout
WATCHED_FILTER = "specgate.ext_proc.watched"  # the split layout's two filters
ONE_TRIP_FILTER = "specgate.ext_proc.one_trip"
WATCH_SHARE_KEY = "specgate.watch_share"  # Envoy runtime key: the share, in millionths
BUFFER = "envoy.filters.http.buffer"
BUFFER_SLACK = 1 << 20  # bytes the one-trip route's buffer takes beyond server.max_body_bytes
_MILLION = 1_000_000

_TYPE = "@type"
_T = "type.googleapis.com/envoy."


def typed(type_name: str, **fields: Any) -> dict[str, Any]:
    return {_TYPE: _T + type_name, **fields}


def duration(seconds: float) -> str:
    """Envoy's duration, to the millisecond (never below one)."""
    return f"{max(seconds, 0.001):.3f}".rstrip("0").rstrip(".") + "s"


def ext_proc_filter(
    *, fail_open: bool, message_timeout_s: float, name: str = EXT_PROC, one_trip: bool = False
) -> dict[str, Any]:
    """The ``ext_proc`` HTTP filter that asks specgate, with the processing modes its EPP
    expects: the watched path's (BUFFERED body, mode overrides), or with ``one_trip`` the
    body streamed to specgate without waiting for the headers' answer."""
    one: dict[str, Any] = {"send_body_without_waiting_for_header_response": True} if one_trip else {}
    return {
        "name": name,
        "typed_config": typed(
            "extensions.filters.http.ext_proc.v3.ExternalProcessor",
            grpc_service={
                "envoy_grpc": {"cluster_name": EPP_CLUSTER},
                "timeout": duration(message_timeout_s),
            },
            failure_mode_allow=fail_open,
            # specgate switches the response phase on for the answers it watches (not honoured
            # where the body goes without waiting: off there).
            allow_mode_override=not one_trip,
            processing_mode={
                "request_header_mode": "SEND",
                "request_body_mode": "STREAMED" if one_trip else "BUFFERED",
                "request_trailer_mode": "SKIP",
                "response_header_mode": "SKIP",
                "response_body_mode": "NONE",
                "response_trailer_mode": "SKIP",
            },
            **one,
            message_timeout=duration(message_timeout_s),
            # Only the headers specgate reads leave Envoy: less for both to encode and parse,
            # and nothing of the client's it has no use for.
            forward_rules={"allowed_headers": {"patterns": [{"exact": h} for h in sorted(WANTED)]}},
            metadata_options={
                # specgate's pick comes back as envoy.lb metadata (Envoy drops namespaces not
                # listed here), its route and reason as specgate metadata; the engine that
                # served goes to specgate as envoy.lb metadata with the response headers.
                "forwarding_namespaces": {"untyped": [LB_NAMESPACE]},
                "receiving_namespaces": {"untyped": [LB_NAMESPACE, SPECGATE_NAMESPACE]},
            },
        ),
    }


def ext_proc_filters(
    *, fail_open: bool, message_timeout_s: float, split: bool, max_body_bytes: int
) -> list[dict[str, Any]]:
    """The layout's ext_proc filters (and the one-trip route's buffer), in chain order."""
    if not split:
        return [ext_proc_filter(fail_open=fail_open, message_timeout_s=message_timeout_s)]
    limit = min(max_body_bytes + BUFFER_SLACK, 0xFFFFFFFF)
    return [
        {
            "name": BUFFER,
            "typed_config": typed("extensions.filters.http.buffer.v3.Buffer", max_request_bytes=limit),
        },
        ext_proc_filter(
            fail_open=fail_open, message_timeout_s=message_timeout_s, name=ONE_TRIP_FILTER, one_trip=True
        ),
        ext_proc_filter(fail_open=fail_open, message_timeout_s=message_timeout_s, name=WATCHED_FILTER),
    ]


_OFF = typed("extensions.filters.http.ext_proc.v3.ExtProcPerRoute", disabled=True)
_NO_BUFFER = typed("extensions.filters.http.buffer.v3.BufferPerRoute", disabled=True)


def share_routes(route: dict[str, Any], watch_share: float | None) -> list[dict[str, Any]]:
    """``route`` as the layout needs it: alone (watched), or twice (split): first matching
    ``watch_share`` of the requests on the watched filter, then the rest on one trip."""
    if watch_share is None:
        return [route]
    if not 0.0 <= watch_share <= 1.0:
        raise ValueError(f"watch_share must be in [0, 1], got {watch_share}")
    fraction = {
        "default_value": {"numerator": round(watch_share * _MILLION), "denominator": "MILLION"},
        "runtime_key": WATCH_SHARE_KEY,
    }
    watched = {
        **route,
        "match": {**route["match"], "runtime_fraction": fraction},
        "typed_per_filter_config": {BUFFER: _NO_BUFFER, ONE_TRIP_FILTER: _OFF},
    }
    return [watched, {**route, "typed_per_filter_config": {WATCHED_FILTER: _OFF}}]
