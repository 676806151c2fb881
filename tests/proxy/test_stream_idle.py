"""The idle limit counts silence between events, not the length of the stream."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.proxy.harness import harness

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "stream": True, "temperature": 0}


def _slow_engine(events: int, gap_s: float) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(events):
            ev = {
                "id": "c",
                "object": "chat.completion.chunk",
                "model": body["model"],
                "choices": [{"index": 0, "delta": {"content": f"t{i}"}, "finish_reason": None}],
            }
            await resp.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
            await asyncio.sleep(gap_s)  # the condition under test: a steady trickle of events
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


async def test_stream_longer_than_idle_limit_is_not_cut() -> None:
    # 10 events 40 ms apart: 0.4 s in all, never 0.25 s of silence.
    engine = TestServer(_slow_engine(10, 0.04))
    await engine.start_server()
    try:
        url = str(engine.make_url(""))
        async with (
            harness(spec_url=url, base_url=url, timeouts={"idle_s": 0.25}) as h,
            aiohttp.ClientSession() as s,
            s.post(h.url("/v1/chat/completions"), json=CHAT) as r,
        ):
            raw = await asyncio.wait_for(r.read(), 10)
    finally:
        await engine.close()
    text = raw.decode()
    assert "error" not in text
    assert all(f'"t{i}"' in text for i in range(10))
    assert text.endswith("data: [DONE]\n\n")
