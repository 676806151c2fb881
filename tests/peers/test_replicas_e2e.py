"""Two gateway replicas on one emulated pair, joined by the peer channel, through sockets:
the OpenAI SDK's requests on one replica are counted, learned from and led by on the
other. Once on an in-process bus, once through a real Redis server (the Debian package;
skipped without it locally, a failure under CI=true)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestServer

from gateway.api.app import build_app
from gateway.api.state import STATE
from gateway.config import GatewayConfig
from gateway.peers.bus import MemoryHub, PeerBus
from gateway.peers.service import PeerService
from gateway.routing.adaptive import AdaptivePolicy
from tests.deploy.helpers import require_tool

pytestmark = pytest.mark.timeout(90)

MODEL = "qwen3-8b"
CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n" * 4
EDIT = [
    {
        "role": "user",
        "content": f"Add type hints, return the full file unchanged otherwise:\n```python\n{CODE}```",
    }
]


@contextlib.asynccontextmanager
async def redis_server(tmp: Path) -> AsyncIterator[str]:
    """A real redis-server on a unix socket (no TCP port to race for); ready when it says so."""
    binary = require_tool("redis-server")
    sock = tmp / "redis.sock"
    proc = await asyncio.create_subprocess_exec(
        binary,
        "--port",
        "0",
        "--unixsocket",
        str(sock),
        "--save",
        "",
        "--appendonly",
        "no",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(20):
            while b"ready to accept connections" not in (line := await proc.stdout.readline()).lower():
                assert line, "redis-server exited"
        yield f"unix://{sock}"
    finally:
        proc.terminate()
        await proc.wait()


async def until(cond: Callable[[], bool], *services: PeerService) -> None:
    """Wait for ``cond``, re-checking after each message a replica applies (no sleeps)."""
    async with asyncio.timeout(20):
        while not cond():
            waits = [asyncio.ensure_future(s.received.wait()) for s in services]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
            for s in services:
                s.received.clear()


@pytest.mark.parametrize("transport", ["memory", "redis"])
async def test_two_replicas_share_requests_answers_and_one_regime(
    transport: str, pair_config: Callable[..., GatewayConfig], tmp_path: Path
) -> None:
    async with contextlib.AsyncExitStack() as stack:
        buses: list[PeerBus | None]
        overrides: dict[str, Any] = {}
        if transport == "memory":
            hub = MemoryHub()
            buses = [hub.bus(), hub.bus()]
        else:
            url = await stack.enter_async_context(redis_server(tmp_path))
            buses, overrides = [None, None], {"peers.url": url, "peers.channel": "t"}
        servers = []
        for name, bus in zip(("a", "b"), buses, strict=True):
            cfg = pair_config(**{"peers.replica_id": name, **overrides})
            srv = TestServer(build_app(cfg, peer_bus=bus))
            await srv.start_server()
            stack.push_async_callback(srv.close)
            servers.append(srv)
        a, b = (s.app[STATE] for s in servers)
        assert a.peers is not None and b.peers is not None
        pa, pb = a.models[MODEL].policy, b.models[MODEL].policy
        assert isinstance(pa, AdaptivePolicy) and isinstance(pb, AdaptivePolicy)
        # one leader: a took the lease first (it started first)
        await until(lambda: a.peers is not None and a.peers.leader, a.peers, b.peers)
        client = await asyncio.to_thread(
            openai.AsyncOpenAI, base_url=str(servers[0].make_url("/v1")), api_key="unused", max_retries=0
        )
        stack.push_async_callback(client.close)
        b_engines = list(b.models[MODEL].engines.values())

        # a's stream is counted by b while it runs, and gone when it ends
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=EDIT,
            temperature=0,
            max_tokens=400,
            stream=True,  # type: ignore[arg-type]
        )
        first = await anext(aiter(stream))
        assert first is not None
        await until(lambda: sum(e.peer_inflight for e in b_engines) == 1, b.peers)
        async for _ in stream:
            pass
        await until(lambda: sum(e.peer_inflight for e in b_engines) == 0, b.peers)

        # a's answers teach b, which served none
        for _ in range(3):
            await client.chat.completions.create(model=MODEL, messages=EDIT, temperature=0, max_tokens=64)  # type: ignore[arg-type]
        await until(lambda: bool(pb.learner.snapshot(pb.live.last_update)), b.peers)
        assert b.models[MODEL].inflight == 0  # b routed nothing itself

        # b follows a's regime
        await until(
            lambda: pb.leader_mode is not None and pb.mode.speculating == pa.mode.speculating, b.peers
        )
        assert not b.peers.leader
        assert b.peers.state()["peers"]  # it hears a


async def test_a_dead_redis_costs_the_channel_not_the_requests(
    pair_config: Callable[..., GatewayConfig], tmp_path: Path
) -> None:
    """Redis goes away: requests keep being answered (nothing on their path waits on the
    channel), the leader loses its lease, and the failures are counted, not raised."""
    async with contextlib.AsyncExitStack() as stack:
        async with redis_server(tmp_path) as url:
            cfg = pair_config(**{"peers.replica_id": "a", "peers.url": url, "peers.timeout_s": 0.5})
            srv = TestServer(build_app(cfg))
            await srv.start_server()
            stack.push_async_callback(srv.close)
            st = srv.app[STATE]
            assert st.peers is not None
            await until(lambda: st.peers is not None and st.peers.leader, st.peers)
        # redis-server has exited
        client = await asyncio.to_thread(
            openai.AsyncOpenAI, base_url=str(srv.make_url("/v1")), api_key="unused", max_retries=0
        )
        stack.push_async_callback(client.close)
        for _ in range(3):
            r = await client.chat.completions.create(model=MODEL, messages=EDIT, temperature=0, max_tokens=16)  # type: ignore[arg-type]
            assert r.choices[0].message.content
        await st.peers.tick()
        assert not st.peers.leader and st.peers.stats["lease_errors"] >= 1
