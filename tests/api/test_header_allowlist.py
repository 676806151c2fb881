"""Only allow-listed client headers reach the engine: 124 client headers cost the engine
nothing, and the client gets its answer."""

from __future__ import annotations

import aiohttp

from tests.proxy.harness import harness

REQ = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.9}
TRACEPARENT = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"


async def test_a_client_with_124_headers_is_answered_and_the_engine_sees_the_allow_list() -> None:
    headers = {f"X-Junk-{i}": "v" * 64 for i in range(118)}
    headers.update(
        {
            "Accept": "application/json",
            "User-Agent": "openai-python/1.99",
            "traceparent": TRACEPARENT,
            "tracestate": "k=v",
            "x-request-id": "client-rid-1",
            "X-Tenant": "t1",
        }
    )
    assert len(headers) == 124
    async with (
        harness(server={"forward_headers": ["X-Tenant"]}) as h,
        aiohttp.ClientSession() as s,
        s.post(h.url("/v1/chat/completions"), json=REQ, headers=headers) as r,
    ):
        assert r.status == 200, await r.text()
        assert r.headers["x-request-id"] == "client-rid-1"
    seen = {k.lower(): v for k, v in h.base.requests[0].headers.items()}
    assert not [k for k in seen if k.startswith("x-junk-")]
    assert seen["traceparent"] == TRACEPARENT and seen["tracestate"] == "k=v"
    assert seen["user-agent"] == "openai-python/1.99" and seen["accept"] == "application/json"
    assert seen["x-request-id"] == "client-rid-1" and seen["x-tenant"] == "t1"
    # Nothing else but what the HTTP client itself sets (host, framing, encoding).
    allowed = {
        "accept",
        "user-agent",
        "traceparent",
        "tracestate",
        "x-request-id",
        "x-tenant",
        "content-type",
    }
    assert set(seen) - allowed <= {"host", "content-length", "accept-encoding", "connection"}, seen
