from __future__ import annotations

import aiohttp

from tests.proxy.harness import harness


async def test_non_stream_roundtrip() -> None:
    async with (
        harness() as h,
        aiohttp.ClientSession() as s,
        s.post(
            h.url("/v1/chat/completions"),
            json={"model": "m1", "messages": [{"role": "user", "content": "hi"}], "temperature": 0},
        ) as r,
    ):
        body = await r.json()
        assert r.status == 200, body
        assert body["model"] == "m1"
        assert r.headers["x-specgate-route"] == "spec"
    assert h.spec.requests[0].body["model"] == "m1-spec"


async def test_stream_roundtrip() -> None:
    async with (
        harness() as h,
        aiohttp.ClientSession() as s,
        s.post(
            h.url("/v1/chat/completions"),
            json={"model": "m1", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        ) as r,
    ):
        raw = await r.read()
        assert r.status == 200
        assert r.headers["x-specgate-route"] == "base"
    events = [e for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    assert b'"model":"m1"' in events[1]
    assert b'"usage"' not in raw  # the gateway asked for usage; the client did not
    assert h.base.requests[0].body["stream_options"] == {"include_usage": True}
