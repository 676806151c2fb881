"""The peer channel wired to this gateway's models (see the package doc).

Everything here runs on the event loop and never waits on the channel in a request's
path: the hooks queue messages (bounded; the oldest dropped when Redis is slow) and a
sender task publishes them; a receiver task applies the others' messages.

Each call on the bus is bounded by an ``asyncio.timeout`` block, not ``asyncio.wait_for``:
on Python 3.11, ``wait_for`` returns the result of a call that answers in the step in
which its task is cancelled and drops the cancel (CPython gh-86296); a sender or leader
task cancelled by :meth:`PeerService.stop` as Redis answered then went on running, and
``stop`` waited for it forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from gateway.config.models import PeersConfig
from gateway.engines.runtime import EngineRuntime, ModelRuntime
from gateway.peers.bus import BusClosed, PeerBus
from gateway.peers.messages import (
    Bye,
    Counts,
    Learned,
    Regime,
    Witness,
    decode,
    encode,
    features_of,
    learned_of,
    outcome_of,
    witness_of,
)
from gateway.routing.types import HARD_RULE_REASONS, Cooperative, Decision, Outcome, RequestFeatures, Route

log = logging.getLogger(__name__)

# A replica whose counts were not heard for this many leases is gone (its requests with it).
_PEER_EXPIRY_LEASES = 2.0
# A follower that has not heard its leader's regime for this many leases decides alone.
_LEADER_SILENT_LEASES = 2.0

_MAX_PEERS = 256  # replicas remembered at most (a flood of made-up names stays bounded)

Mover = Callable[[str, Route], None]  # (model, route whose streams move to their siblings)


def default_replica_id() -> str:
    return f"{socket.gethostname()[:60]}-{os.getpid()}-{secrets.token_hex(3)}"


class PeerService:
    def __init__(
        self,
        cfg: PeersConfig,
        bus: PeerBus,
        models: Mapping[str, ModelRuntime],
        *,
        on_move: Mover | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self.bus = bus
        self.models = dict(models)
        self.replica = cfg.replica_id or default_replica_id()
        self.on_move = on_move
        self.clock = clock
        self.leader = False
        self.stats: Counter[str] = Counter()
        self._out: deque[bytes] = deque(maxlen=cfg.queue)
        self._wake = asyncio.Event()
        self._counts_pending = False
        self._peers: dict[str, tuple[float, dict[str, int]]] = {}  # replica -> (heard at, counts)
        self._said: dict[str, tuple[bool, bool]] = {}  # per model: the regime last published
        self._heard: dict[str, float] = {}  # per model: when the leader's regime was last heard
        self._tasks: list[asyncio.Task[Any]] = []
        self.received = asyncio.Event()  # set after each message applied (tests wait on it)
        for name, m in self.models.items():
            for e in m.engines.values():
                e.on_inflight = self._inflight_changed
            if isinstance(m.policy, Cooperative):
                m.on_decided.append(partial(self._decided, name))
                m.on_outcome.append(partial(self._learned, name))

    def adopt(self, engine: EngineRuntime) -> None:
        """Count ``engine``'s requests on the channel too (a pair that joined while serving)."""
        engine.on_inflight = self._inflight_changed

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        """Join the channel, then make the first lease attempt (each bounded by the
        channel's timeout): once started, a replica hears every message published after
        (if Redis confirmed its subscription in time; else the receiver subscribes in the
        background) and knows whether it leads, and of two replicas started one after the
        other the first leads, if its attempt was answered in time."""
        try:
            async with asyncio.timeout(self.cfg.timeout_s):
                await self.bus.start()
        except Exception as exc:  # the gateway starts without the channel; receive retries
            log.warning("peer channel: joining %s failed (%s)", self.cfg.channel, type(exc).__name__)
        await self.tick()
        self._tasks = [
            asyncio.create_task(self._send_loop(), name="peers-send"),
            asyncio.create_task(self._receive_loop(), name="peers-receive"),
            asyncio.create_task(self._lead_loop(), name="peers-lead"),
        ]
        log.info("peer channel: replica %s on %s", self.replica, self.cfg.channel)

    async def stop(self) -> None:
        """Say goodbye (the others drop this replica's counts at once), give the lease up,
        end the tasks and close the bus: every step bounded by the channel's timeout."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.cfg.timeout_s):
                await self.bus.publish(encode(Bye(r=self.replica)))
        if self.leader:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.cfg.timeout_s):
                    await self.bus.resign(self.replica)
        tasks, self._tasks = self._tasks, []
        for t in tasks:
            t.cancel()
        if tasks:
            done, stuck = await asyncio.wait(tasks, timeout=self.cfg.timeout_s)
            for t in done:
                if not t.cancelled() and t.exception() is not None:
                    log.error("peer channel: task %s had failed", t.get_name(), exc_info=t.exception())
            if stuck:  # a bus that swallows cancellation: left behind, not waited for forever
                names = ", ".join(sorted(t.get_name() for t in stuck))
                log.error("peer channel: task(s) %s did not end when cancelled", names)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.cfg.timeout_s):
                await self.bus.close()

    # -- this replica's events (hooks; never block, never raise) ------------------------------
    def _send(self, msg: Counts | Witness | Learned | Regime | Bye) -> None:
        if len(self._out) == self._out.maxlen:
            self.stats["dropped_queue_full"] += 1
        self._out.append(encode(msg))
        self._wake.set()

    def _inflight_changed(self) -> None:
        """Counts go out once per loop iteration, however many changed in it."""
        if not self._counts_pending:
            self._counts_pending = True
            asyncio.get_running_loop().call_soon(self._send_counts)

    def _send_counts(self) -> None:
        self._counts_pending = False
        counts = {e.name: e.inflight for m in self.models.values() for e in m.engines.values()}
        self._send(Counts(r=self.replica, engines=counts))

    def _decided(
        self, model: str, features: RequestFeatures, d: Decision, loads: tuple[float, float]
    ) -> None:
        if d.reason not in HARD_RULE_REASONS:
            self._send(witness_of(self.replica, model, features, d.route, loads))
        self._publish_regime(model)

    def _learned(self, model: str, outcome: Outcome) -> None:
        msg = learned_of(self.replica, model, outcome)
        if msg is not None:
            self._send(msg)

    def _publish_regime(self, model: str, *, again: bool = False) -> None:
        policy = self.models[model].policy
        if not self.leader or not isinstance(policy, Cooperative):
            return
        regime = policy.regime()
        if again or self._said.get(model) != regime:
            self._said[model] = regime
            self._send(Regime(r=self.replica, model=model, speculating=regime[0], quiet=regime[1]))

    # -- the others' messages ------------------------------------------------------------------
    def apply(self, data: bytes) -> None:
        """Apply one message from the channel (invalid ones are counted and dropped)."""
        msg = decode(data)
        if msg is None:
            self.stats["dropped_invalid"] += 1
            return
        if msg.r == self.replica:
            return
        self.stats["received"] += 1
        now = self.clock()
        if isinstance(msg, Counts):
            if msg.r not in self._peers and len(self._peers) >= _MAX_PEERS:
                self.stats["dropped_too_many_peers"] += 1
                return
            self._peers[msg.r] = (now, dict(msg.engines))
            self._apply_counts()
        elif isinstance(msg, Bye):
            if self._peers.pop(msg.r, None) is not None:
                self._apply_counts()
        elif (m := self.models.get(msg.model)) is None or not isinstance(m.policy, Cooperative):
            self.stats["dropped_unknown_model"] += 1
        elif isinstance(msg, Witness):
            self._moved(msg.model, m.policy.witness(features_of(msg), msg.route, now, msg.loads))
            self._publish_regime(msg.model)
        elif isinstance(msg, Learned):
            m.policy.observe(outcome_of(msg), now)
            self._publish_regime(msg.model)
        elif isinstance(msg, Regime) and not self.leader:
            self._heard[msg.model] = now
            self._moved(msg.model, m.policy.follow_leader(msg.speculating, now, quiet=msg.quiet))

    def _moved(self, model: str, route: Route | None) -> None:
        if route is not None and self.on_move is not None:
            self.on_move(model, route)

    def _apply_counts(self) -> None:
        for m in self.models.values():
            for e in m.engines.values():
                e.peer_inflight = sum(c.get(e.name, 0) for _, c in self._peers.values())

    def _expire(self, now: float) -> None:
        horizon = now - _PEER_EXPIRY_LEASES * self.cfg.lease_s
        gone = [r for r, (at, _) in self._peers.items() if at < horizon]
        for r in gone:
            del self._peers[r]
        if gone:
            self._apply_counts()
        if not self.leader:
            silent = now - _LEADER_SILENT_LEASES * self.cfg.lease_s
            for name, m in self.models.items():
                if isinstance(m.policy, Cooperative) and self._heard.get(name, -1e18) < silent:
                    self._heard.pop(name, None)
                    m.policy.follow_leader(None, now)

    # -- tasks -----------------------------------------------------------------------------
    async def _send_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._out:
                data = self._out.popleft()
                try:
                    async with asyncio.timeout(self.cfg.timeout_s):
                        await self.bus.publish(data)
                    self.stats["sent"] += 1
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self.stats["send_errors"] += 1
                    if self.stats["send_errors"] % 100 == 1:
                        log.warning("peer channel: publishing failed (%s)", type(exc).__name__)

    async def _receive_loop(self) -> None:
        while True:
            try:
                data = await self.bus.receive()
            except BusClosed:
                return
            try:
                self.apply(data)
            except Exception:  # a policy bug must not end the channel
                log.exception("peer channel: applying a message failed")
            self.received.set()

    async def _lead_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.lease_s / 3.0)
            await self.tick()

    async def tick(self) -> None:
        """Renew (or take) the lease, publish the regimes while leading, send this
        replica's counts as a heartbeat, forget silent peers."""
        try:
            async with asyncio.timeout(self.cfg.timeout_s):
                leader = await self.bus.lead(self.replica, self.cfg.lease_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            leader = False
            self.stats["lease_errors"] += 1
            if self.stats["lease_errors"] % 20 == 1:
                log.warning("peer channel: the leader's lease is unreachable (%s)", type(exc).__name__)
        now = self.clock()
        if leader != self.leader:
            log.info("peer channel: replica %s %s", self.replica, "leads" if leader else "follows")
            self.leader = leader
            self._said.clear()
            for m in self.models.values():
                if isinstance(m.policy, Cooperative) and leader:
                    m.policy.follow_leader(None, now)  # it decides the regime now
        for name in self.models:
            self._publish_regime(name, again=True)
        self._send_counts()
        self._expire(now)

    def peer_names(self) -> list[str]:
        return list(self._peers)

    def state(self) -> dict[str, object]:
        """For GET /admin/state."""
        now = self.clock()
        return {
            "replica": self.replica,
            "channel": self.cfg.channel,
            "leader": self.leader,
            "peers": {
                r: {"heard_s_ago": round(now - at, 3), "inflight": c} for r, (at, c) in self._peers.items()
            },
            "messages": dict(self.stats),
        }
