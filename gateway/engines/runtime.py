"""Live state of the engines behind the gateway.

:class:`EngineRuntime` holds one engine's exact in-flight count (kept by the proxy),
its passive health (consecutive connect/5xx failures take it out for a cooldown; one
success brings it back), the active health flag set by the health checker, a draining
flag, and the scraper's latest :class:`~gateway.engines.stats.ScrapeState`. It turns
all that into the immutable :class:`~gateway.routing.types.EngineView` the routing core
reads (the scraped :class:`~gateway.routing.types.EngineStats` record as it is, or
unknown when stale). :class:`ModelRuntime` groups a model's pairs, its policy and its pinned route.

The pairs may change while serving (:mod:`gateway.fleet`): ``pairs`` and ``engines`` are
replaced, never mutated in place, so a request keeps the engines it started with; a pair
that leaves is ``leaving`` (draining) until its requests end: the routing view no longer
shows it, ``engines`` still holds it (failover and moves of its own requests, admin).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from gateway.config.models import EngineConfig, ModelConfig, PairConfig
from gateway.engines.stats import ScrapeState
from gateway.routing.types import (
    UNKNOWN_STATS,
    Decision,
    EngineView,
    ModelView,
    Outcome,
    PairBound,
    PairView,
    Policy,
    RequestFeatures,
    Route,
    RouteOverride,
)

Clock = Callable[[], float]
_CLOSED_KEPT_S = 10.0  # early closes a view carries: scrapes older than this are stale anyway


class EngineRuntime:
    def __init__(
        self,
        config: EngineConfig,
        route: Route,
        *,
        device: str = "",
        failures_to_unhealthy: int = 3,
        cooldown_s: float = 5.0,
        failure_rate: float = 1.0,
        failure_window_s: float = 10.0,
        failure_min_attempts: int = 10,
        clock: Clock = time.monotonic,
    ) -> None:
        self.config = config
        self.name = config.name
        self.route = route
        self.device = device
        self.failures_to_unhealthy = failures_to_unhealthy
        self.cooldown_s = cooldown_s
        self.failure_rate = failure_rate
        self.failure_window_s = failure_window_s
        self.failure_min_attempts = failure_min_attempts
        self._outcomes: deque[tuple[float, bool]] = deque()  # (time, failed) within the window
        self._window_failures = 0
        self._clock = clock
        self.inflight = 0
        # requests closed before the engine finished them, newest last (EngineView.closed_at)
        self._closed_at: deque[float] = deque(maxlen=256)
        # requests other gateway replicas have in flight here, as their peer channel last
        # told (gateway.peers); 0 without one
        self.peer_inflight = 0
        self.on_inflight: Callable[[], None] | None = None  # called when ``inflight`` changes
        self.draining = False
        self.scrape: ScrapeState | None = None  # the scraper's latest report (None: none yet)
        self.active_healthy = True  # set by the active health checker
        self.consecutive_failures = 0
        self.down_until: float | None = None
        self.total_requests = 0
        self.total_failures = 0
        self.last_error: str | None = None

    # -- in-flight accounting --------------------------------------------------------
    @contextmanager
    def track(self) -> Iterator[None]:
        """Count one request in flight on this engine for the duration of the block."""
        self.inflight += 1
        self.total_requests += 1
        if self.on_inflight is not None:
            self.on_inflight()
        try:
            yield
        finally:
            self.inflight -= 1
            if self.on_inflight is not None:
                self.on_inflight()

    def closed_early(self) -> None:
        """The gateway stopped relaying a request this engine had not finished (closing the
        response is what makes vLLM abort it, at its next step): its scraped gauges count the
        request a moment longer than ``inflight`` does."""
        self._closed_at.append(self._clock())

    def _recent_closes(self, now: float) -> tuple[float, ...]:
        closed = self._closed_at
        while closed and closed[0] < now - _CLOSED_KEPT_S:  # oldest first: drop what aged out
            closed.popleft()
        return tuple(closed)

    # -- passive health --------------------------------------------------------------
    def record_success(self, now: float | None = None) -> None:
        self.consecutive_failures = 0
        self.down_until = None
        self._outcome(self._clock() if now is None else now, failed=False)

    def record_failure(self, error: str, now: float | None = None) -> None:
        """A connect error, 5xx or timeout before the first byte, or a broken stream.

        Out for ``cooldown_s`` after ``failures_to_unhealthy`` failures in a row, or when at
        least ``failure_rate`` of the (≥ ``failure_min_attempts``) attempts of the last
        ``failure_window_s`` failed."""
        now = self._clock() if now is None else now
        self.total_failures += 1
        self.consecutive_failures += 1
        self.last_error = error
        self._outcome(now, failed=True)
        n = len(self._outcomes)
        by_rate = n >= self.failure_min_attempts and self._window_failures >= self.failure_rate * n
        if self.consecutive_failures >= self.failures_to_unhealthy or by_rate:
            self.down_until = now + self.cooldown_s
            self._outcomes.clear()  # judged afresh after the cooldown
            self._window_failures = 0

    def _outcome(self, now: float, *, failed: bool) -> None:
        q = self._outcomes
        q.append((now, failed))
        self._window_failures += failed
        horizon = now - self.failure_window_s
        while q and (q[0][0] < horizon or len(q) > 4096):
            self._window_failures -= q.popleft()[1]

    def passive_healthy(self, now: float) -> bool:
        return self.down_until is None or now >= self.down_until

    def healthy(self, now: float | None = None) -> bool:
        now = self._clock() if now is None else now
        return self.active_healthy and self.passive_healthy(now)

    # -- views -----------------------------------------------------------------------
    def view(self, now: float, stale_after_s: float) -> EngineView:
        s = self.scrape
        fresh = s.stats if s is not None and s.ok and now - s.scraped_at <= stale_after_s else None
        return EngineView(
            name=self.name,
            route=self.route,
            healthy=self.healthy(now),
            draining=self.draining,
            stale=fresh is None,
            inflight=self.inflight + self.peer_inflight,
            closed_at=self._recent_closes(now),
            method=self.config.method,
            k=self.config.k,
            stats=fresh if fresh is not None else UNKNOWN_STATS,
        )

    def state(self, now: float) -> dict[str, object]:
        """JSON-ready state for GET /admin/state."""
        return {
            "name": self.name,
            "route": self.route.value,
            "device": self.device,
            "url": self.config.url,
            "served_model_name": self.config.served_model_name,
            "method": self.config.method,
            "k": self.config.k,
            "inflight": self.inflight,
            "peer_inflight": self.peer_inflight,
            "healthy": self.healthy(now),
            "active_healthy": self.active_healthy,
            "passive_down_for_s": max(0.0, self.down_until - now) if self.down_until is not None else 0.0,
            "consecutive_failures": self.consecutive_failures,
            "draining": self.draining,
            "total_requests": self.total_requests,
            "total_failures": self.total_failures,
            "last_error": self.last_error,
            "stats": self.scrape.as_dict() if self.scrape is not None else None,
        }


@dataclass(slots=True)
class PairRuntime:
    spec: EngineRuntime | None  # None: the plain engine alone (advisor mode)
    base: EngineRuntime
    device: str = ""
    name: str = ""  # the pair's key (PairConfig.key): stable while the pair lives
    config: PairConfig | None = None  # what it was built from (None: built by hand, in tests)
    leaving: bool = False  # draining: no new request goes to it (gateway.fleet)
    source: str = "config"  # who declared it: "config", "dns", "kubernetes"

    @property
    def engines(self) -> tuple[EngineRuntime, ...]:
        return (self.base,) if self.spec is None else (self.spec, self.base)

    @property
    def inflight(self) -> int:
        """This gateway's requests on the pair's engines (a draining pair waits for 0)."""
        return sum(e.inflight for e in self.engines)

    def leave(self) -> None:
        """Start draining: every engine of the pair stops taking new requests for good."""
        self.leaving = True
        for e in self.engines:
            e.draining = True

    def state(self, now: float) -> dict[str, object]:
        return {
            "name": self.name,
            "device": self.device,
            "status": "draining" if self.leaving else "active",
            "source": self.source,
            "spec": None if self.spec is None else self.spec.state(now),
            "base": self.base.state(now),
        }


def pair_runtime(
    model: ModelConfig, pair: PairConfig, *, source: str = "config", clock: Clock = time.monotonic
) -> PairRuntime:
    """The runtime of one configured pair of ``model`` (its engines take the model's retry settings)."""

    def make(e: EngineConfig, route: Route) -> EngineRuntime:
        r = model.retry
        return EngineRuntime(
            e,
            route,
            device=pair.device,
            failures_to_unhealthy=r.failures_to_unhealthy,
            cooldown_s=r.cooldown_s,
            failure_rate=r.failure_rate_to_unhealthy,
            failure_window_s=r.failure_window_s,
            failure_min_attempts=r.failure_rate_min_attempts,
            clock=clock,
        )

    spec = None if pair.spec is None else make(pair.spec, Route.SPEC)
    return PairRuntime(spec, make(pair.base, Route.BASE), pair.device, pair.key, pair, source=source)


@dataclass
class ModelRuntime:
    config: ModelConfig
    pairs: list[PairRuntime]
    policy: Policy
    stale_after_s: float = 5.0
    pinned: RouteOverride = RouteOverride.AUTO
    engines: dict[str, EngineRuntime] = field(default_factory=dict)
    inflight: int = 0  # client requests in flight for this model (the gateway's own count)
    # Called after the policy decided a request (features, decision, the load its pair
    # held: requests on spec, on plain) and after it learned from an outcome: the peer
    # channel (gateway.peers) tells the other replicas.
    on_decided: list[Callable[[RequestFeatures, Decision, tuple[float, float]], None]] = field(
        default_factory=list
    )
    on_outcome: list[Callable[[Outcome], None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.engines = {e.name: e for p in self.pairs for e in p.engines}
        self._bind()

    def _bind(self) -> None:
        """Tell a pair-bound policy the model's speculative method and k (before any answer)."""
        spec = next((p.spec for p in self.pairs if p.spec is not None and not p.leaving), None)
        if spec is not None and isinstance(self.policy, PairBound):
            self.policy.bind(spec.config.method, spec.config.k)

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def active_pairs(self) -> list[PairRuntime]:
        """The pairs that take new requests (not draining)."""
        return [p for p in self.pairs if not p.leaving]

    def pair_of(self, engine: str | None) -> PairRuntime | None:
        """The pair (active or draining) that holds engine ``engine``."""
        return next((p for p in self.pairs if any(e.name == engine for e in p.engines)), None)

    def set_pairs(self, pairs: list[PairRuntime]) -> None:
        """Replace the pairs (and the engine map) at once: a request in flight keeps the
        containers it read (copy on write), so its engines stay reachable to it."""
        bind = not any(p.spec is not None for p in self.active_pairs)
        self.pairs = list(pairs)
        self.engines = {e.name: e for p in self.pairs for e in p.engines}
        if bind:
            self._bind()

    @classmethod
    def from_config(
        cls, config: ModelConfig, policy: Policy, *, stale_after_s: float = 5.0, clock: Clock = time.monotonic
    ) -> ModelRuntime:
        pairs = [pair_runtime(config, p, clock=clock) for p in config.pairs]
        return cls(config=config, pairs=pairs, policy=policy, stale_after_s=stale_after_s)

    def view(self, now: float) -> ModelView:
        """What the policy decides on: the active pairs only (a draining pair is invisible)."""
        return ModelView(
            model=self.config.name,
            pairs=tuple(
                PairView(
                    spec=None if p.spec is None else p.spec.view(now, self.stale_after_s),
                    base=p.base.view(now, self.stale_after_s),
                    device=p.device,
                )
                for p in self.pairs
                if not p.leaving
            ),
            pinned=self.pinned,
        )

    def state(self, now: float) -> dict[str, object]:
        try:
            policy_state = self.policy.snapshot()
        except Exception as exc:  # a policy bug must not break the admin endpoint
            policy_state = {"error": f"snapshot failed: {type(exc).__name__}"}
        return {
            "model": self.config.name,
            "policy": getattr(self.policy, "name", type(self.policy).__name__),
            "pinned": self.pinned.value,
            "inflight": self.inflight,
            "pairs": [p.state(now) for p in self.pairs],
            "policy_state": policy_state,
        }
