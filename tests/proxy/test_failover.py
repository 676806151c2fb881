"""Retries on the sibling engine, passive health, and quick errors when nothing can serve."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import aiohttp
from multidict import CIMultiDict

from gateway.api.state import STATE
from tests.proxy.fake_engine import FakeEngine
from tests.proxy.harness import harness

SPEC_REQ = {"model": "m1", "messages": [{"role": "user", "content": "copy this"}], "temperature": 0.0}
BASE_REQ = {**SPEC_REQ, "temperature": 0.9}


def _dead_url() -> str:
    """A loopback URL nobody listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def _post(url: str, body: dict[str, object]) -> tuple[int, CIMultiDict[str], bytes]:
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        return r.status, CIMultiDict(r.headers), await r.read()


async def test_connection_refused_retries_on_sibling() -> None:
    dead = await asyncio.to_thread(_dead_url)
    async with harness(spec_url=dead) as h:
        status, headers, body = await _post(h.url("/v1/chat/completions"), SPEC_REQ)
        assert status == 200, body
        assert headers["x-specgate-route"] == "base"
        assert headers["x-specgate-reason"] == "failover"
        assert json.loads(body)["model"] == "m1"
        assert len(h.base.requests) == 1
        assert h.base.requests[0].body["model"] == "m1-base"


async def test_5xx_before_first_byte_retries_on_sibling() -> None:
    spec = FakeEngine("m1-spec", status=503)
    async with harness(spec=spec) as h:
        status, headers, _ = await _post(h.url("/v1/chat/completions"), {**SPEC_REQ, "stream": True})
        assert status == 200
        assert headers["x-specgate-route"] == "base"
        assert len(spec.requests) == 1 and len(h.base.requests) == 1


async def test_first_byte_timeout_retries_on_sibling_and_aborts_the_slow_engine() -> None:
    spec = FakeEngine("m1-spec", hang_after_headers=True)
    async with harness(spec=spec, timeouts={"first_byte_s": 0.3}) as h:
        status, headers, body = await _post(h.url("/v1/chat/completions"), {**SPEC_REQ, "stream": True})
        assert status == 200
        assert headers["x-specgate-route"] == "base"
        assert body.endswith(b"data: [DONE]\n\n")
        await asyncio.wait_for(spec.aborted.wait(), 5)


async def test_refused_params_are_never_moved_to_the_spec_engine() -> None:
    base = FakeEngine("m1-base", status=503)
    async with harness(base=base) as h:
        status, headers, body = await _post(h.url("/v1/chat/completions"), {**SPEC_REQ, "min_p": 0.1})
        # the engine's own error passes through; the spec engine never saw the request
        assert status == 503
        assert json.loads(body)["error"]["message"] == "engine says no"
        assert headers["x-specgate-route"] == "base"
        assert headers["x-specgate-reason"] == "refused_params"
        assert h.spec.requests == []


async def test_both_engines_unreachable_gives_503_quickly() -> None:
    dead1, dead2 = await asyncio.to_thread(_dead_url), await asyncio.to_thread(_dead_url)
    async with harness(spec_url=dead1, base_url=dead2) as h:
        t0 = time.monotonic()
        status, headers, body = await _post(h.url("/v1/chat/completions"), SPEC_REQ)
        assert time.monotonic() - t0 < 10.0  # no waiting for total_s (20 s): refused connections fail fast
        assert status == 503
        err = json.loads(body)["error"]
        assert err["code"] == "no_engine_available" and "reachable" in err["message"]
        assert headers["Retry-After"] == "1"
        assert set(err) == {"message", "type", "param", "code"}
        assert headers["x-specgate-route"] == "base"  # the last engine tried


async def test_no_retry_when_disabled() -> None:
    dead = await asyncio.to_thread(_dead_url)
    async with harness(spec_url=dead, retry={"on_sibling": False}) as h:
        status, _, _ = await _post(h.url("/v1/chat/completions"), SPEC_REQ)
        assert status == 502
        assert h.base.requests == []


async def test_engine_4xx_passes_through_without_retry() -> None:
    spec = FakeEngine("m1-spec", status=400)
    async with harness(spec=spec) as h:
        status, headers, body = await _post(h.url("/v1/chat/completions"), SPEC_REQ)
        assert status == 400
        assert json.loads(body)["error"]["message"] == "engine says no"
        assert headers["x-specgate-route"] == "spec"
        assert h.base.requests == []


async def test_total_timeout_non_stream_gives_504() -> None:
    base = FakeEngine("m1-base", hang_before_headers=True)
    timeouts = {"first_byte_s": 0.3, "total_s": 0.3}
    async with harness(base=base, timeouts=timeouts, retry={"on_sibling": False}) as h:
        status, _, body = await _post(h.url("/v1/chat/completions"), BASE_REQ)
        assert status == 504
        assert json.loads(body)["error"]["code"] == "upstream_timeout"
        await asyncio.wait_for(base.aborted.wait(), 5)


async def test_passive_health_takes_a_failing_engine_out_then_back() -> None:
    dead = await asyncio.to_thread(_dead_url)
    async with harness(spec_url=dead, retry={"failures_to_unhealthy": 2, "cooldown_s": 60}) as h:
        for _ in range(2):
            status, headers, _ = await _post(h.url("/v1/chat/completions"), SPEC_REQ)
            assert headers["x-specgate-reason"] == "failover"
        status, headers, _ = await _post(h.url("/v1/chat/completions"), SPEC_REQ)
        assert status == 200
        assert headers["x-specgate-reason"] == "spec_down"  # skipped without trying
        spec_rt = h.app[STATE].models["m1"].engines["spec0"]
        assert not spec_rt.healthy()
        spec_rt.record_success()
        assert spec_rt.healthy()
