"""Streaming on the wire: no buffering, disconnect propagation, mid-stream failures."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from gateway.proxy.sse import DONE
from tests.proxy.fake_engine import FakeEngine
from tests.proxy.harness import harness

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "say hello"}], "stream": True}


async def _next_event(resp: aiohttp.ClientResponse) -> bytes:
    """Read one SSE event (up to the blank line)."""
    buf = b""
    while b"\n\n" not in buf:
        line = await resp.content.readline()
        assert line, f"stream ended early after {buf!r}"
        buf += line
    return buf.strip()


def _events(raw: bytes) -> list[bytes]:
    return [e for e in raw.split(b"\n\n") if e.strip()]


async def test_client_sees_first_event_before_engine_sends_second() -> None:
    gate = asyncio.Event()
    base = FakeEngine("m1-base", gate=gate)
    async with (
        harness(base=base) as h,
        aiohttp.ClientSession() as s,
        s.post(h.url("/v1/chat/completions"), json=CHAT) as r,
    ):
        assert r.status == 200
        first = await asyncio.wait_for(_next_event(r), 5)
        # The engine is parked on the gate: the second event does not exist yet.
        assert not gate.is_set()
        assert first.startswith(b"data: ")
        assert json.loads(first[6:])["model"] == "m1"
        gate.set()
        rest = await r.read()
        assert _events(rest)[-1] == b"data: [DONE]"


async def test_client_disconnect_aborts_engine_request() -> None:
    gate = asyncio.Event()  # never set: the engine would wait forever
    base = FakeEngine("m1-base", gate=gate)
    async with harness(base=base) as h:
        async with aiohttp.ClientSession() as s:
            r = await s.post(h.url("/v1/chat/completions"), json=CHAT)
            await asyncio.wait_for(_next_event(r), 5)
            r.close()  # the client goes away mid-stream
        await asyncio.wait_for(base.aborted.wait(), 5)
        assert not base.finished.is_set()
        # the in-flight count drops back to zero
        state = h.app
        from gateway.api.state import STATE

        for _ in range(100):
            if state[STATE].inflight == 0:
                break
            await asyncio.sleep(0.01)
        assert state[STATE].inflight == 0
        assert state[STATE].models["m1"].engines["base0"].inflight == 0


async def test_disconnect_while_waiting_for_non_stream_answer_aborts_engine() -> None:
    base = FakeEngine("m1-base", hang_before_headers=True)
    async with harness(base=base) as h:
        async with aiohttp.ClientSession() as s:
            task = asyncio.ensure_future(
                s.post(h.url("/v1/chat/completions"), json={**CHAT, "stream": False})
            )
            await asyncio.wait_for(base.received.wait(), 5)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        await asyncio.wait_for(base.aborted.wait(), 5)


async def test_engine_dying_mid_stream_sends_error_event_then_done_and_no_retry() -> None:
    base = FakeEngine("m1-base", die_after_first=True)
    async with (
        harness(base=base) as h,
        aiohttp.ClientSession() as s,
        s.post(h.url("/v1/chat/completions"), json=CHAT) as r,
    ):
        assert r.status == 200
        raw = await asyncio.wait_for(r.read(), 5)
        evs = _events(raw)
        assert evs[-1] == b"data: [DONE]"
        err = json.loads(evs[-2][6:])
        assert err["error"]["type"] == "upstream_error"
        assert "broke off" in err["error"]["message"]
        assert h.spec.requests == []  # nothing is retried after bytes reached the client


async def test_idle_timeout_mid_stream() -> None:
    gate = asyncio.Event()
    base = FakeEngine("m1-base", gate=gate)
    async with (
        harness(base=base, timeouts={"idle_s": 0.2}) as h,
        aiohttp.ClientSession() as s,
        s.post(h.url("/v1/chat/completions"), json=CHAT) as r,
    ):
        raw = await asyncio.wait_for(r.read(), 5)
        evs = _events(raw)
        assert evs[-1] == b"data: [DONE]"
        err = json.loads(evs[-2][6:])
        assert err["error"]["code"] == 504
        assert "stalled" in err["error"]["message"]
        await asyncio.wait_for(base.aborted.wait(), 5)


async def test_engine_error_event_passes_through_with_done() -> None:
    base = FakeEngine("m1-base", send_error_event=True)
    async with (
        harness(base=base) as h,
        aiohttp.ClientSession() as s,
        s.post(h.url("/v1/chat/completions"), json=CHAT) as r,
    ):
        assert r.status == 200
        raw = await r.read()
    evs = _events(raw)
    assert json.loads(evs[0][6:])["error"]["message"] == "min_p is not supported"
    assert evs[-1] == b"data: [DONE]"
    assert len(evs) == 2


async def test_usage_chunk_forwarded_when_client_asks_and_model_rewritten() -> None:
    spec = FakeEngine("m1-spec", spec_metrics={"mean_acceptance_length": 3.5, "draft_acceptance_rate": 0.6})
    async with harness(spec=spec) as h, aiohttp.ClientSession() as s:
        body = {**CHAT, "temperature": 0.0, "stream_options": {"include_usage": True}}
        async with s.post(h.url("/v1/chat/completions"), json=body) as r:
            raw = await r.read()
    evs = [json.loads(e[6:]) for e in _events(raw)[:-1]]
    assert all(e["model"] == "m1" for e in evs)
    assert evs[-1]["choices"] == [] and evs[-1]["usage"]["completion_tokens"] == 4
    assert b"m1-spec" not in raw
    assert spec.requests[0].body["stream_options"] == {"include_usage": True}


async def test_completions_stream_with_spaced_json_model_field() -> None:
    # an engine whose JSON has spaces after colons (Python's json.dumps default)
    base = FakeEngine("m1-base", spaced_json=True)
    async with (
        harness(base=base) as h,
        aiohttp.ClientSession() as s,
        s.post(h.url("/v1/completions"), json={"model": "m1", "prompt": "once upon", "stream": True}) as r,
    ):
        raw = await r.read()
    texts = [json.loads(e[6:])["choices"][0]["text"] for e in _events(raw)[:-1]]
    assert "".join(texts) == "Hello, world!"
    assert all(json.loads(e[6:])["model"] == "m1" for e in _events(raw)[:-1])
    assert base.requests[0].path == "/v1/completions"


async def test_events_split_across_chunks_comments_and_non_json_pass_through() -> None:
    ev1 = b'data: {"id":"a","model":"m1-base","choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
    ev2 = b'data: {"id":"b","model": "m1-base","choices":[{"index":0,"delta":{"content":" there"}}]}\n\n'
    base = FakeEngine(
        "m1-base",
        raw_stream=[
            b": keep-alive\n\n",
            ev1[:17],
            ev1[17:40],
            ev1[40:] + ev2[:5],
            ev2[5:],
            b"data: not json\n\n",
            DONE,
        ],
    )
    async with (
        harness(base=base) as h,
        aiohttp.ClientSession() as s,
        s.post(h.url("/v1/chat/completions"), json=CHAT) as r,
    ):
        raw = await r.read()
    evs = _events(raw)
    assert evs[0] == b": keep-alive"
    assert json.loads(evs[1][6:]) == {
        "id": "a",
        "model": "m1",
        "choices": [{"index": 0, "delta": {"content": "Hi"}}],
    }
    assert json.loads(evs[2][6:])["model"] == "m1" and json.loads(evs[2][6:])["id"] == "b"
    assert evs[3] == b"data: not json"
    assert evs[4] == b"data: [DONE]" and len(evs) == 5


async def test_stream_without_done_gets_an_error_event_and_done() -> None:
    ev = b'data: {"id":"a","model":"m1-base","choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
    base = FakeEngine("m1-base", raw_stream=[ev])  # ends cleanly but without [DONE]
    async with (
        harness(base=base) as h,
        aiohttp.ClientSession() as s,
        s.post(h.url("/v1/chat/completions"), json=CHAT) as r,
    ):
        raw = await r.read()
    evs = _events(raw)
    assert json.loads(evs[0][6:])["model"] == "m1"
    assert json.loads(evs[1][6:])["error"]["code"] == 502
    assert evs[2] == b"data: [DONE]"
