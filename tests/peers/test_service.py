"""The peer service on an in-memory bus (no sockets): counts, learning and the leader's
regime reach the other replica, a dead leader is replaced, bad input is dropped."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from gateway.config import load_config
from gateway.config.models import PeersConfig
from gateway.engines.runtime import ModelRuntime
from gateway.peers.bus import BusClosed, MemoryBus, MemoryHub
from gateway.peers.service import PeerService
from gateway.routing.adaptive import AdaptivePolicy
from gateway.routing.config import RoutingConfig
from gateway.routing.types import Outcome, RequestFeatures, Route

MODEL = "qwen3-8b"
EDIT = RequestFeatures(MODEL, temperature=0.0, max_tokens=200, prompt_tokens=400, overlap=0.9, kind="edit")


@dataclass
class Clock:
    t: float = 100.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Replica:
    service: PeerService
    model: ModelRuntime
    moves: list[tuple[str, Route]] = field(default_factory=list)

    @property
    def policy(self) -> AdaptivePolicy:
        assert isinstance(self.model.policy, AdaptivePolicy)
        return self.model.policy


def make(hub: MemoryHub, name: str, clock: Clock, **routing: object) -> Replica:
    cfg = load_config(None, env={})
    policy = AdaptivePolicy(RoutingConfig(policy="adaptive", **routing))  # type: ignore[arg-type]
    model = ModelRuntime.from_config(cfg.models[0], policy)
    moves: list[tuple[str, Route]] = []
    svc = PeerService(
        PeersConfig(replica_id=name, lease_s=3.0),
        hub.bus(),
        {MODEL: model},
        on_move=lambda m, r: moves.append((m, r)),
        clock=clock,
    )
    return Replica(svc, model, moves)


async def settle(hub: MemoryHub, *replicas: Replica) -> None:
    """Until every message published so far has been sent and applied: the queues stay
    empty for a few loop iterations in a row (a message passes through two tasks)."""
    quiet = 0
    for _ in range(2000):
        await asyncio.sleep(0)  # let the send and receive tasks run
        idle = all(not r.service._out for r in replicas) and all(b.queue.empty() for b in hub.buses)
        quiet = quiet + 1 if idle else 0
        if quiet >= 20:
            return
    raise AssertionError("the channel did not settle")


@pytest.fixture
async def two() -> AsyncIterator[tuple[MemoryHub, Clock, Replica, Replica]]:
    clock = Clock()
    hub = MemoryHub(clock)
    a, b = make(hub, "a", clock), make(hub, "b", clock)
    await a.service.start()
    await a.service.tick()  # a takes the lease first
    await b.service.start()
    await b.service.tick()
    await settle(hub, a, b)
    try:
        yield hub, clock, a, b
    finally:
        await a.service.stop()
        await b.service.stop()


async def test_each_replica_counts_the_others_requests_in_flight(
    two: tuple[MemoryHub, Clock, Replica, Replica],
) -> None:
    hub, _, a, b = two
    spec_a, spec_b = a.model.pairs[0].spec, b.model.pairs[0].spec
    with spec_a.track(), spec_a.track():
        await settle(hub, a, b)
        assert spec_b.peer_inflight == 2 and spec_b.inflight == 0
        assert spec_b.view(0.0, 5.0).inflight == 2  # what b's policy reads
    await settle(hub, a, b)
    assert spec_b.peer_inflight == 0


async def test_the_leader_decides_the_regime_and_the_others_follow_with_their_streams(
    two: tuple[MemoryHub, Clock, Replica, Replica],
) -> None:
    hub, clock, a, b = two
    assert a.service.leader and not b.service.leader
    a.policy.controller.mode.follow(True)
    a.service._publish_regime(MODEL)
    await settle(hub, a, b)
    assert b.policy.cluster.leader_mode is True and b.policy.controller.mode.speculating
    # the leader leaves spec (busy pair, not quiet): b follows, and its streams on spec move
    a.policy.controller.mode.follow(False)
    a.policy.quiet.quiet = False
    a.service._publish_regime(MODEL)
    await settle(hub, a, b)
    assert not b.policy.controller.mode.speculating
    assert b.moves == [(MODEL, Route.SPEC)]
    # b's own decision follows the leader's regime, whatever b would have decided alone
    clock.t += 1.0
    assert b.policy.cluster.leader_quiet is False


async def test_answers_learned_on_one_replica_teach_the_other(
    two: tuple[MemoryHub, Clock, Replica, Replica],
) -> None:
    hub, clock, a, b = two
    before = b.policy.estimator.learner.snapshot(clock.t)
    out = Outcome(
        MODEL, Route.SPEC, "spec-0", "edit", 0.0, True, 400, 200, 0.02, 0.004, lookup_acceptance=0.8
    )
    for hook in a.model.on_outcome:
        hook(out)
    await settle(hub, a, b)
    assert b.policy.estimator.learner.snapshot(clock.t) != before


async def test_a_silent_leader_is_replaced_and_its_followers_decide_alone_meanwhile(
    two: tuple[MemoryHub, Clock, Replica, Replica],
) -> None:
    hub, clock, a, b = two
    a.service._publish_regime(MODEL, again=True)
    await settle(hub, a, b)
    assert b.policy.cluster.leader_mode is not None
    for t in a.service._tasks:  # a hangs: no renewals, no messages
        t.cancel()
    clock.t += 2.0 * 3.0 + 0.1
    await b.service.tick()
    assert b.service.leader and b.policy.cluster.leader_mode is None  # b leads: decides alone


async def test_bad_or_foreign_messages_are_dropped_and_counted(
    two: tuple[MemoryHub, Clock, Replica, Replica],
) -> None:
    hub, _, a, b = two
    await hub.buses[0].publish(b'{"t": "counts", "r": "x", "engines": {"spec-0": 1e9}}')
    await hub.buses[0].publish(
        b'{"t": "regime", "r": "x", "model": "nope", "speculating": true, "quiet": false}'
    )
    await settle(hub, a, b)
    assert b.service.stats["dropped_invalid"] >= 1
    assert b.service.stats["dropped_unknown_model"] >= 1
    assert b.model.pairs[0].spec.peer_inflight == 0


def test_a_replica_without_a_cooperative_policy_only_shares_counts() -> None:
    from gateway.routing.static import FixedPolicy

    cfg = load_config(None, env={})
    model = ModelRuntime.from_config(cfg.models[0], FixedPolicy(Route.SPEC))
    PeerService(PeersConfig(replica_id="s"), MemoryHub().bus(), {MODEL: model})
    assert model.on_decided == [] and model.on_outcome == []
    assert model.pairs[0].spec.on_inflight is not None


async def test_the_channel_shows_in_prometheus_metrics(
    two: tuple[MemoryHub, Clock, Replica, Replica],
) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from gateway.peers.metrics import PeerCollector

    _, _, a, b = two
    for replica, leads in ((a, 1.0), (b, 0.0)):
        reg = CollectorRegistry()
        reg.register(PeerCollector(replica.service))
        text = generate_latest(reg).decode()
        assert f"specgate_peer_leader {leads}" in text
        assert "specgate_peer_replicas 1.0" in text
        sent = next(
            ln for ln in text.splitlines() if ln.startswith('specgate_peer_messages_total{result="sent"}')
        )
        assert float(sent.split()[-1]) > 0


async def test_made_up_replicas_cannot_grow_the_peer_table_without_bound(
    two: tuple[MemoryHub, Clock, Replica, Replica],
) -> None:
    from gateway.peers.service import _MAX_PEERS

    _, _, _, b = two
    for i in range(_MAX_PEERS + 50):
        b.service.apply(f'{{"t": "counts", "r": "fake-{i}", "engines": {{"spec0": 1}}}}'.encode())
    assert len(b.service.peer_names()) == _MAX_PEERS
    assert b.service.stats["dropped_too_many_peers"] >= 50


class CancelledAsItAnswers(MemoryBus):
    """A bus on which a task is cancelled in the very step in which its call (``publish``
    or ``lead``) answers: where :meth:`PeerService.stop`'s cancel lands when Redis answers
    just then, which a loaded machine makes likely."""

    def __init__(self, hub: MemoryHub) -> None:
        super().__init__(hub)
        hub.buses.append(self)
        self.armed: tuple[asyncio.Task[object], str] | None = None
        self.landed = asyncio.Event()

    def _answering(self, call: str) -> None:
        if self.armed is not None and self.armed[1] == call:
            task, _ = self.armed
            self.armed = None
            task.cancel()
            self.landed.set()

    async def publish(self, data: bytes) -> None:
        await super().publish(data)
        self._answering("publish")

    async def lead(self, me: str, ttl_s: float) -> bool:
        leads = await super().lead(me, ttl_s)
        self._answering("lead")
        return leads


def alone(bus: MemoryBus, **peers: object) -> PeerService:
    cfg = load_config(None, env={})
    model = ModelRuntime.from_config(cfg.models[0], AdaptivePolicy(RoutingConfig(policy="adaptive")))
    return PeerService(PeersConfig(replica_id="a", **peers), bus, {MODEL: model})  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "call"), [("peers-send", "publish"), ("peers-lead", "lead")])
async def test_a_task_cancelled_as_its_call_on_the_bus_answers_ends(name: str, call: str) -> None:
    """stop() cancels the sender and the leader wherever they are; one whose publish or
    lease call answers in that very step ends all the same. (Bounded by
    ``asyncio.wait_for`` on Python 3.11, the call's result was returned and the cancel
    dropped: the task went on, and stop() waited for it forever.)"""
    hub = MemoryHub()
    bus = CancelledAsItAnswers(hub)
    svc = alone(bus, lease_s=0.5)  # the leader renews every 1/6 s
    await svc.start()
    try:
        task = next(t for t in svc._tasks if t.get_name() == name)
        bus.armed = (task, call)
        svc._send_counts()  # the sender publishes at once
        async with asyncio.timeout(5):
            await bus.landed.wait()
        await asyncio.wait([task], timeout=5)
        assert task.done(), f"{name} went on after its cancel: stop() would wait for it forever"
        assert task.cancelled()
    finally:
        async with asyncio.timeout(5):
            await svc.stop()


class IgnoresCancel(MemoryBus):
    """A bus whose ``receive`` swallows cancellation until released."""

    def __init__(self, hub: MemoryHub) -> None:
        super().__init__(hub)
        hub.buses.append(self)
        self.receiving = asyncio.Event()
        self.released = asyncio.Event()

    async def receive(self) -> bytes:
        self.receiving.set()
        while not self.released.is_set():
            try:
                await self.released.wait()
            except asyncio.CancelledError:
                pass
        raise BusClosed


async def test_stop_does_not_wait_forever_for_a_task_that_ignores_its_cancel(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bus = IgnoresCancel(MemoryHub())
    svc = alone(bus, timeout_s=0.1)
    await svc.start()
    receiver = next(t for t in svc._tasks if t.get_name() == "peers-receive")
    async with asyncio.timeout(5):
        await bus.receiving.wait()
    stopping = asyncio.ensure_future(svc.stop())  # awaited directly, a stuck stop() hangs the test
    try:
        await asyncio.wait([stopping], timeout=5)
        assert stopping.done(), "stop() waits for a task that ignores its cancel"
        assert not receiver.done() and "peers-receive did not end when cancelled" in caplog.text
    finally:
        bus.released.set()
        async with asyncio.timeout(5):
            await asyncio.gather(receiver, stopping)


class Unreachable(MemoryBus):
    def __init__(self, hub: MemoryHub) -> None:
        super().__init__(hub)
        hub.buses.append(self)

    async def start(self) -> None:
        raise ConnectionRefusedError


async def test_a_replica_starts_without_the_channel(caplog: pytest.LogCaptureFixture) -> None:
    """Joining the channel fails: the replica starts all the same (the receiver joins in
    the background), and says so."""
    svc = alone(Unreachable(MemoryHub()))
    await svc.start()
    try:
        assert len(svc._tasks) == 3 and not any(t.done() for t in svc._tasks)
        assert "joining specgate failed (ConnectionRefusedError)" in caplog.text
    finally:
        await svc.stop()
