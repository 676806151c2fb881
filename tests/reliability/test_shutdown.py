"""Graceful shutdown of a real ``specgate serve`` process on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import yaml

from specgate_lab.bench.procs import emulated_pair_model, start_serve
from specgate_lab.emulator.launch import EmulatorGroup, pair_launches, start_group
from tests.reliability.rig import BASE, SPEC, chat, until

REPO = Path(__file__).resolve().parents[2]


@asynccontextmanager
async def _pair() -> AsyncIterator[EmulatorGroup]:
    group = await start_group(
        pair_launches(port_spec=0, port_base=0, name_spec=SPEC, name_base=BASE), time_scale=0.02
    )
    try:
        yield group
    finally:
        await group.stop()


@asynccontextmanager
async def _gateway(
    group: EmulatorGroup, tmp: Path, grace_s: float
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    spec_url, base_url = group.urls
    model = emulated_pair_model(
        spec_url, base_url, spec_served=SPEC, base_served=BASE, routing={"policy": "always-spec"}
    )
    cfg = {
        "server": {"host": "127.0.0.1", "port": 0, "shutdown_grace_s": grace_s},
        "scrape": {"interval_s": 0.2},
        "models": [model],
    }
    path = tmp / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc, url = await start_serve(path, cwd=REPO)
    try:
        yield proc, url
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _ready_is(url: str, status: int) -> bool:
    return await _ready(url) == status


async def _ready(url: str) -> int:
    async with aiohttp.ClientSession() as s, s.get(url + "/ready") as r:
        return r.status


async def test_sigterm_drains_ready_turns_false_new_requests_refused_inflight_finishes(
    tmp_path: Path,
) -> None:
    async with _pair() as group, _gateway(group, tmp_path, grace_s=20.0) as (proc, url):
        spec = group.by_name(SPEC).handle
        assert await _ready(url) == 200
        spec.set_faults({"hang": "mid_stream", "mid_stream_chunks": 2})  # hold the stream mid-way
        async with aiohttp.ClientSession() as s:
            resp = await s.post(url + "/v1/chat/completions", json={**chat(max_tokens=60), "stream": True})
            assert resp.status == 200
            first = await resp.content.readany()
            assert first.startswith(b"data: ")
            proc.send_signal(signal.SIGTERM)
            # /ready turns false (on a new connection), new requests are refused in OpenAI's shape.
            await until(lambda: _ready_is(url, 503), 10, "/ready turns 503")
            async with (
                aiohttp.ClientSession() as fresh,
                fresh.post(url + "/v1/chat/completions", json=chat()) as r,
            ):
                assert r.status == 503
                err = (await r.json())["error"]
                assert err["code"] == "shutting_down" and r.headers["Retry-After"] == "1"
            assert proc.returncode is None  # still draining: the held stream is in flight
            spec.set_faults({"hang": "none"})  # let it finish
            rest = await resp.read()
            assert rest.endswith(b"data: [DONE]\n\n") and b'"error"' not in rest
            resp.release()
        async with asyncio.timeout(10):
            assert await proc.wait() == 0


async def test_sigterm_grace_deadline_bounds_a_stream_that_never_ends(tmp_path: Path) -> None:
    async with _pair() as group, _gateway(group, tmp_path, grace_s=1.0) as (proc, url):
        spec = group.by_name(SPEC).handle
        spec.set_faults({"hang": "mid_stream", "mid_stream_chunks": 2})
        async with aiohttp.ClientSession() as s:
            resp = await s.post(url + "/v1/chat/completions", json={**chat(max_tokens=60), "stream": True})
            assert resp.status == 200 and await resp.content.readany()
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(10):
                assert await proc.wait() == 0
            assert loop.time() - t0 < 1.0 + 3.0  # grace + cleanup, not the engine's hang
            # Cut at the deadline, but cleanly: an error event, then [DONE].
            rest = await resp.read()
            assert rest.endswith(b"data: [DONE]\n\n")
            assert b"shutting down" in rest and b'"error"' in rest
        spec.set_faults({"hang": "none"})
