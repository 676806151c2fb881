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
from gateway.placement import FleetPolicy
from tests.peers.helpers import redis_server, within

pytestmark = pytest.mark.timeout(90)

MODEL = "qwen3-8b"
CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n" * 4
EDIT = [
    {
        "role": "user",
        "content": f"Add type hints, return the full file unchanged otherwise:\n```python\n{CODE}```",
    }
]
STEP_S = 30.0  # each HTTP call, start and shutdown (the SDK's own default is 600 s)


async def until(what: str, cond: Callable[[], bool], *services: PeerService) -> None:
    """Wait for ``cond``, re-checking after each message a replica applies (no sleeps);
    past 20 s, fail naming ``what``, with the replicas' channel states."""

    async def wait() -> None:
        while not cond():
            waits = [asyncio.ensure_future(s.received.wait()) for s in services]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
            for s in services:
                s.received.clear()

    try:
        await within(what, wait(), 20)
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}; the replicas' channels: {[s.state() for s in services]}") from exc


async def drain(chunks: AsyncIterator[Any]) -> None:
    async for _ in chunks:
        pass


@pytest.mark.parametrize("transport", ["memory", "redis"])
async def test_two_replicas_share_requests_answers_and_one_regime(
    transport: str,
    pair_config: Callable[..., GatewayConfig],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
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
            await within(f"replica {name} to start", srv.start_server(), STEP_S)
            stack.push_async_callback(within, f"replica {name} to shut down", srv.close(), STEP_S)
            servers.append(srv)
            peers = srv.app[STATE].peers
            assert peers is not None
            if name == "a":
                # one leader: a, whose lease b finds taken when it starts. a's first attempt,
                # made as it starts, can time out on a loaded machine (b would then take the
                # lease and keep it); a tries again every third of the lease, alone so far.
                await until("replica a to lead", lambda p=peers: p.leader, peers)
        a, b = (s.app[STATE] for s in servers)
        assert a.peers is not None and b.peers is not None
        # b is subscribed (it hears a) before a serves a request
        a.peers._send_counts()  # a's heartbeat now, not at its next renewal
        hearing = b.peers
        await until("b to hear a", lambda: "a" in hearing.peer_names(), hearing)
        fa, fb = a.models[MODEL].policy, b.models[MODEL].policy
        assert isinstance(fa, FleetPolicy) and isinstance(fb, FleetPolicy)  # one pair: its policy decides
        pa, pb = fa.primary, fb.primary
        client = await within(
            "the OpenAI client",
            asyncio.to_thread(
                openai.AsyncOpenAI,
                base_url=str(servers[0].make_url("/v1")),
                api_key="unused",
                max_retries=0,
                timeout=STEP_S,
            ),
        )
        stack.push_async_callback(within, "the OpenAI client to close", client.close())
        b_engines = list(b.models[MODEL].engines.values())
        # what b counts of a's requests, after each message it applies: a short stream
        # (milliseconds here) can be counted and gone before this task looks again
        counted: list[int] = []
        apply = b.peers.apply

        def counting(data: bytes) -> None:
            apply(data)
            counted.append(sum(e.peer_inflight for e in b_engines))

        monkeypatch.setattr(b.peers, "apply", counting)

        # a's stream is counted by b while it runs, and gone when it ends
        stream = await within(
            "a's stream to open",
            client.chat.completions.create(
                model=MODEL,
                messages=EDIT,
                temperature=0,
                max_tokens=400,
                stream=True,  # type: ignore[arg-type]
            ),
            STEP_S,
        )
        stack.push_async_callback(within, "a's stream to close", stream.close())
        chunks = aiter(stream)
        first = await within("a's stream's first chunk", anext(chunks), STEP_S)
        assert first is not None
        await until("b to count a's stream", lambda: 1 in counted, b.peers)
        await within("the rest of a's stream", drain(chunks), STEP_S)
        await until(
            "b to count a's stream gone", lambda: sum(e.peer_inflight for e in b_engines) == 0, b.peers
        )

        # a's answers teach b, which served none
        for i in range(3):
            await within(
                f"a's answer {i + 1} of 3",
                client.chat.completions.create(model=MODEL, messages=EDIT, temperature=0, max_tokens=64),  # type: ignore[arg-type]
                STEP_S,
            )
        await until(
            "b to learn from a's answers",
            lambda: bool(pb.estimator.learner.snapshot(pb.estimator.live.last_update)),
            b.peers,
        )
        assert b.models[MODEL].inflight == 0  # b routed nothing itself

        # b follows a's regime
        await until(
            "b to follow a's regime",
            lambda: (
                pb.cluster.leader_mode is not None
                and pb.controller.mode.speculating == pa.controller.mode.speculating
            ),
            b.peers,
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
            await within("replica a to start", srv.start_server(), STEP_S)
            stack.push_async_callback(within, "replica a to shut down", srv.close(), STEP_S)
            st = srv.app[STATE]
            assert st.peers is not None
            await until("replica a to lead", lambda: st.peers is not None and st.peers.leader, st.peers)
        # redis-server has exited
        client = await within(
            "the OpenAI client",
            asyncio.to_thread(
                openai.AsyncOpenAI,
                base_url=str(srv.make_url("/v1")),
                api_key="unused",
                max_retries=0,
                timeout=STEP_S,
            ),
        )
        stack.push_async_callback(within, "the OpenAI client to close", client.close())
        for i in range(3):
            r = await within(
                f"answer {i + 1} of 3 without Redis",
                client.chat.completions.create(model=MODEL, messages=EDIT, temperature=0, max_tokens=16),  # type: ignore[arg-type]
                STEP_S,
            )
            assert r.choices[0].message.content
        await within("a lease attempt without Redis", st.peers.tick())
        assert not st.peers.leader and st.peers.stats["lease_errors"] >= 1
