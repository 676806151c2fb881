"""Engine faults, injected with the emulator's knobs, never make things worse for clients."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import aiohttp
import openai
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from gateway.api.app import build_app
from tests.reliability.rig import BASE, COPY_PROMPT, SPEC, Rig, chat, gateway_config, post, rig, until

SPEC_REQ = chat(COPY_PROMPT, temperature=0.0, max_tokens=40)  # the temperature policy sends it to spec
FORCE_SPEC = {"x-specgate-route": "spec"}


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


async def _metrics(session: aiohttp.ClientSession, r: Rig) -> str:
    async with session.get(r.url("/metrics")) as resp:
        return await resp.text()


async def test_crash_mid_stream_ends_the_stream_promptly_then_routes_around_until_recovery() -> None:
    async with rig() as r, aiohttp.ClientSession() as s:
        r.faults(SPEC, crash_after_requests=0, crash_mid_stream=True, mid_stream_chunks=2)
        t0 = time.monotonic()
        reply = await post(s, r.url("/v1/chat/completions"), {**SPEC_REQ, "stream": True, "max_tokens": 400})
        took = time.monotonic() - t0
        # The client got what was streamed, then an error event and [DONE]; no hang.
        assert reply.status == 200 and reply.headers["x-specgate-route"] == "spec"
        assert reply.events[-1] == b"data: [DONE]"
        err = json.loads(reply.events[-2][len(b"data: ") :])["error"]
        assert err["code"] == 502 and "broke off" in err["message"]
        assert any(b'"delta"' in e for e in reply.events[:-2])  # real content came first
        assert took < 5.0
        # Active health checks notice the dead port; the engine is taken out...
        await until(lambda: not r.engine("spec0").healthy(), 5, "spec marked unhealthy")
        for _ in range(3):
            again = await post(s, r.url("/v1/chat/completions"), {**SPEC_REQ, "stream": True})
            assert again.status == 200 and again.events[-1] == b"data: [DONE]"
            assert again.headers["x-specgate-route"] == "base"
            assert b'"error"' not in again.body
        # ...and brought back once it answers again.
        await r.restart(SPEC)
        await until(lambda: r.engine("spec0").healthy(), 5, "spec healthy again")
        back = await post(s, r.url("/v1/chat/completions"), SPEC_REQ)
        assert back.status == 200 and back.headers["x-specgate-route"] == "spec"
        assert r.state.inflight == 0


async def test_passive_outlier_detection_takes_a_failing_engine_out_without_health_checks() -> None:
    # /health keeps answering 200, but every completion fails: only passive detection sees it.
    async with rig(retry={"failures_to_unhealthy": 2, "cooldown_s": 30.0}) as r, aiohttp.ClientSession() as s:
        r.faults(SPEC, error_rate=1.0)
        for _ in range(2):
            reply = await post(s, r.url("/v1/chat/completions"), SPEC_REQ)
            assert reply.status == 200 and reply.headers["x-specgate-reason"] == "failover"
        spec_seen = r.emulated(SPEC).handle.requests_seen
        assert not r.engine("spec0").healthy() and r.engine("spec0").active_healthy
        for _ in range(3):
            reply = await post(s, r.url("/v1/chat/completions"), SPEC_REQ)
            assert reply.status == 200 and reply.headers["x-specgate-route"] == "base"
            assert reply.headers["x-specgate-reason"] != "failover"  # routed around, not retried
        assert r.emulated(SPEC).handle.requests_seen == spec_seen  # the sick engine got nothing


async def test_failure_before_first_byte_is_retried_on_the_sibling_invisibly_but_counted() -> None:
    async with rig() as r, aiohttp.ClientSession() as s:
        r.faults(SPEC, error_rate=1.0)
        client = openai.AsyncOpenAI(base_url=r.url("/v1"), api_key="none", max_retries=0)
        try:
            out = await client.chat.completions.create(**SPEC_REQ)
            stream = await client.chat.completions.create(**SPEC_REQ, stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        finally:
            await client.close()
        assert out.choices[0].message.content and text  # the client saw plain successes
        assert out.model == "m1"
        assert r.emulated(SPEC).handle.requests_seen == 2
        assert r.engine("spec0").total_failures == 2
        m = await _metrics(s, r)
        assert _metric(m, "specgate_upstream_retries_total", engine="spec0") == 2
        assert _metric(m, "specgate_upstream_failures_total", engine="spec0") >= 2


async def test_engine_refusing_connections_is_retried_on_the_sibling() -> None:
    async with rig() as r, aiohttp.ClientSession() as s:
        await r.crash(SPEC)  # port closed: connection refused
        reply = await post(s, r.url("/v1/chat/completions"), {**SPEC_REQ, "stream": True})
        assert reply.status == 200 and reply.headers["x-specgate-reason"] == "failover"
        assert reply.events[-1] == b"data: [DONE]" and b'"error"' not in reply.body


async def test_both_engines_down_is_an_openai_503_within_the_connect_timeout() -> None:
    async with rig(timeouts={"connect_s": 1.0}) as r, aiohttp.ClientSession() as s:
        await r.crash(SPEC)
        await r.crash(BASE)
        for body in (SPEC_REQ, {**SPEC_REQ, "stream": True}):
            t0 = time.monotonic()
            reply = await post(s, r.url("/v1/chat/completions"), body)
            assert time.monotonic() - t0 < 1.0
            assert reply.status == 503
            assert set(reply.json()["error"]) == {"message", "type", "param", "code"}
            assert reply.json()["error"]["code"] == "no_engine_available"
            assert reply.headers["retry-after"] == "1"
        # Once health checks mark both down, the gateway answers 503 without trying.
        await until(lambda: not r.engine("spec0").healthy() and not r.engine("base0").healthy(), 5)
        reply = await post(s, r.url("/v1/chat/completions"), SPEC_REQ)
        assert reply.status == 503 and reply.json()["error"]["code"] == "no_engine_available"


def _black_hole() -> tuple[socket.socket, list[socket.socket], str]:
    """A listening socket whose accept queue is full: new connects hang (SYNs are dropped)."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(0)
    port = lsock.getsockname()[1]
    fillers: list[socket.socket] = []
    for _ in range(8):  # enough to fill a backlog of 0/1 on Linux
        c = socket.socket()
        c.setblocking(False)
        try:
            c.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(c)
    return lsock, fillers, f"http://127.0.0.1:{port}"


async def test_connect_timeout_bounds_a_black_holed_engine() -> None:
    lsock, fillers, url = await asyncio.to_thread(_black_hole)
    try:
        cfg = gateway_config(url, url, timeouts={"connect_s": 0.5}, scrape={"enabled": False})
        gw = TestServer(build_app(cfg))
        await gw.start_server()
        try:
            async with aiohttp.ClientSession() as s:
                t0 = time.monotonic()
                reply = await post(s, str(gw.make_url("/v1/chat/completions")), SPEC_REQ)
                took = time.monotonic() - t0
        finally:
            await gw.close()
    finally:
        for c in fillers:
            c.close()
        lsock.close()
    assert reply.status == 503, reply.body
    assert reply.json()["error"]["code"] == "no_engine_available"
    assert 2 * 0.5 <= took < 2 * 0.5 + 0.8  # two connect timeouts (spec, then base), nothing more


async def test_hang_before_first_byte_fires_first_byte_timeout_and_fails_over() -> None:
    async with rig(timeouts={"first_byte_s": 0.5}) as r, aiohttp.ClientSession() as s:
        r.faults(SPEC, hang="accept")
        t0 = time.monotonic()
        reply = await post(s, r.url("/v1/chat/completions"), {**SPEC_REQ, "stream": True})
        assert reply.status == 200 and reply.headers["x-specgate-reason"] == "failover"
        assert reply.events[-1] == b"data: [DONE]"
        assert 0.5 <= time.monotonic() - t0 < 3.0
        r.faults(SPEC, hang="none")


async def test_both_hanging_non_stream_is_bounded_by_total_timeout() -> None:
    async with rig(timeouts={"total_s": 1.0, "first_byte_s": 1.0}) as r, aiohttp.ClientSession() as s:
        r.faults(SPEC, hang="accept")
        r.faults(BASE, hang="accept")
        t0 = time.monotonic()
        reply = await post(s, r.url("/v1/chat/completions"), SPEC_REQ)
        took = time.monotonic() - t0
        assert reply.status == 504 and reply.json()["error"]["code"] == "upstream_timeout"
        assert 1.0 <= took < 2.5
        t0 = time.monotonic()
        reply = await post(s, r.url("/v1/chat/completions"), {**SPEC_REQ, "stream": True})
        assert reply.status == 504 and time.monotonic() - t0 < 2.5
        r.faults(SPEC, hang="none")
        r.faults(BASE, hang="none")
        assert r.state.inflight == 0 and r.engine("spec0").inflight == 0 and r.engine("base0").inflight == 0


async def test_hang_mid_stream_fires_the_idle_timeout() -> None:
    async with rig(timeouts={"idle_s": 0.5}) as r, aiohttp.ClientSession() as s:
        r.faults(SPEC, hang="mid_stream", mid_stream_chunks=2)
        t0 = time.monotonic()
        reply = await post(s, r.url("/v1/chat/completions"), {**SPEC_REQ, "stream": True, "max_tokens": 400})
        took = time.monotonic() - t0
        r.faults(SPEC, hang="none")
        assert reply.status == 200 and reply.events[-1] == b"data: [DONE]"
        err = json.loads(reply.events[-2][len(b"data: ") :])["error"]
        assert err["code"] == 504 and "stalled" in err["message"]
        assert 0.5 <= took < 3.0
        assert r.engine("spec0").last_error == "idle_timeout"


async def test_one_engine_known_down_and_the_other_unreachable_is_503_not_502() -> None:
    async with rig(retry={"failures_to_unhealthy": 1, "cooldown_s": 30.0}) as r, aiohttp.ClientSession() as s:
        r.faults(SPEC, error_rate=1.0)
        assert (await post(s, r.url("/v1/chat/completions"), SPEC_REQ)).headers[
            "x-specgate-reason"
        ] == "failover"
        assert not r.engine("spec0").healthy()  # taken out passively
        await r.crash(BASE)
        reply = await post(s, r.url("/v1/chat/completions"), SPEC_REQ)
        assert reply.status == 503 and reply.json()["error"]["code"] == "no_engine_available"
        assert reply.headers["retry-after"] == "1"
