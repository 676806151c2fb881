"""Header hygiene: request ids and hop-by-hop headers."""

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


_UP_DROP = HOP_BY_HOP | _NOT_UPSTREAM | {REQUEST_ID, "content-type"}
_DOWN_DROP = HOP_BY_HOP | _NOT_DOWNSTREAM | {REQUEST_ID, "content-type"}


def upstream_headers(client: Mapping[str, str]) -> CIMultiDict[str]:
    """End-to-end client headers to forward (no hop-by-hop, no credentials, no framing)."""
    return _filtered(client.items(), _UP_DROP, _connection_tokens(client))


def downstream_headers(engine: Mapping[str, str]) -> CIMultiDict[str]:
    """Engine response headers to copy to the client."""
    return _filtered(engine.items(), _DOWN_DROP, _connection_tokens(engine))
