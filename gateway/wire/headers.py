"""Header hygiene: request ids, the allow-list of headers forwarded to engines, hop-by-hop headers."""

from __future__ import annotations

import itertools
import re
import uuid
from collections.abc import Iterable, Mapping

from multidict import CIMultiDict

REQUEST_ID = "x-request-id"
ROUTE = "x-specgate-route"
REASON = "x-specgate-reason"
ENGINE = "x-specgate-engine"

_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")

# RFC 9110 §7.6.1 hop-by-hop headers, plus Proxy-* and the ones the gateway sets itself.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "proxy-authorization",
        "proxy-authenticate",
        "proxy-connection",
    }
)
# Headers a proxy adds to say whom it relays (lower case): a request carrying one did not
# come straight from its TCP peer.
PROXY_HEADERS = frozenset(
    {
        "forwarded",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-forwarded-proto",
        "x-forwarded-port",
        "x-forwarded-server",
        "x-original-forwarded-for",
        "x-real-ip",
        "x-client-ip",
        "true-client-ip",
        "cf-connecting-ip",
        "via",
    }
)
# Never forwarded upstream: client credentials, framing the gateway recomputes, and
# client-spoofable proxy/identity headers an engine or its proxies might trust.
_NOT_UPSTREAM = frozenset(
    {"authorization", "host", "content-length", "content-encoding", "accept-encoding", "cookie", "expect"}
    | {"x-api-key", "api-key"}
    | {"forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "x-forwarded-port"}
    | {
        "x-real-ip",
        "x-client-ip",
        "true-client-ip",
        "x-original-url",
        "x-rewrite-url",
        "x-http-method-override",
    }
)
# Never copied from the engine's response to the client.
_NOT_DOWNSTREAM = frozenset(
    {"content-length", "content-encoding", "server", "date", "set-cookie", "www-authenticate"}
)


_ID_PREFIX = uuid.uuid4().hex[:16]  # random per process: ids stay unique across replicas
_ID_COUNTER = itertools.count(1)


def new_request_id() -> str:
    """32 hex characters: a per-process random prefix and a counter (no syscall per request)."""
    return f"{_ID_PREFIX}{next(_ID_COUNTER) & 0xFFFFFFFFFFFFFFFF:016x}"


def request_id(value: str | None) -> str:
    """The client's ``x-request-id`` when it is safe (1-128 of [A-Za-z0-9._:-]), else a new one."""
    if value and _REQUEST_ID_RE.fullmatch(value):
        return value
    return new_request_id()


def _connection_tokens(headers: Mapping[str, str]) -> frozenset[str]:
    value = headers.get("Connection") or headers.get("connection")
    if not value:
        return frozenset()
    return frozenset(t.strip().lower() for t in value.split(",") if t.strip())


def _filtered(
    items: Iterable[tuple[str, str]], drop: frozenset[str], extra: frozenset[str]
) -> CIMultiDict[str]:
    out: CIMultiDict[str] = CIMultiDict()
    for k, v in items:
        lk = k.lower()
        if lk in drop or lk in extra or lk.startswith(("proxy-", "x-specgate-")):
            continue
        out.add(k, v)
    return out


_DOWN_DROP = HOP_BY_HOP | _NOT_DOWNSTREAM | {REQUEST_ID, "content-type"}

# Client headers forwarded to an engine: only these (plus ``server.forward_headers``).
# The gateway itself sets Content-Type, x-request-id, Authorization (the engine's key) and,
# with tracing on, traceparent/tracestate.
FORWARDED = frozenset({"accept", "user-agent", "traceparent", "tracestate", "baggage"})
_TOKEN_RE = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")
_NEVER_FORWARDED = HOP_BY_HOP | _NOT_UPSTREAM | {REQUEST_ID, "content-type"}


def check_forwardable(name: str) -> str:
    """``name`` lower-cased when a client may have it forwarded (``server.forward_headers``)."""
    lk = name.strip().lower()
    if not _TOKEN_RE.fullmatch(lk):
        raise ValueError(f"not a header name: {name!r}")
    if lk in _NEVER_FORWARDED or lk.startswith(("proxy-", "x-specgate-")):
        raise ValueError(f"header {name!r} is never forwarded (credentials, framing or hop-by-hop)")
    return lk


def upstream_headers(client: Mapping[str, str], extra: Iterable[str] = ()) -> CIMultiDict[str]:
    """The client headers forwarded to the engine: those named in :data:`FORWARDED` or
    ``extra`` (lower-case names), unless the client lists them in ``Connection``."""
    allow = FORWARDED.union(extra) if extra else FORWARDED
    hop = _connection_tokens(client)
    out: CIMultiDict[str] = CIMultiDict()
    for k, v in client.items():
        lk = k.lower()
        if lk in allow and lk not in hop:
            out.add(k, v)
    return out


def downstream_headers(engine: Mapping[str, str]) -> CIMultiDict[str]:
    """Engine response headers to copy to the client."""
    return _filtered(engine.items(), _DOWN_DROP, _connection_tokens(engine))
