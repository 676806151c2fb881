"""EngineRuntime / ModelRuntime: exact in-flight counts, passive health, staleness, views."""

from __future__ import annotations

import pytest

from gateway.config import load_config
from gateway.engines.runtime import EngineRuntime, ModelRuntime
from gateway.engines.stats import ScrapeState
from gateway.routing.adaptive import AdaptivePolicy
from gateway.routing.static import FixedPolicy
from gateway.routing.types import EngineStats, Route, RouteOverride
from tests.fakes import FakeClock


def _model(clock: FakeClock) -> ModelRuntime:
    cfg = load_config(
        None, env={}, overrides={"models.0.retry.failures_to_unhealthy": 2, "models.0.retry.cooldown_s": 5}
    )
    return ModelRuntime.from_config(cfg.models[0], FixedPolicy(Route.SPEC), stale_after_s=3.0, clock=clock)


def test_inflight_is_exact_even_when_the_block_raises() -> None:
    m = _model(FakeClock())
    rt = m.engines["spec0"]
    with rt.track(), rt.track():
        assert rt.inflight == 2
    with pytest.raises(RuntimeError), rt.track():
        assert rt.inflight == 1
        raise RuntimeError
    assert rt.inflight == 0 and rt.total_requests == 3


def test_passive_health_failures_cooldown_and_success_reset() -> None:
    clock = FakeClock()
    rt: EngineRuntime = _model(clock).engines["base0"]
    rt.record_failure("connect")
    assert rt.healthy()  # one failure is not enough
    rt.record_success()
    rt.record_failure("connect")
    assert rt.healthy()  # the success reset the streak
    rt.record_failure("status_503")
    assert not rt.healthy() and rt.last_error == "status_503"
    clock.t += 4.9
    assert not rt.healthy()
    clock.t += 0.2
    assert rt.healthy()  # cooldown over: tried again
    rt.active_healthy = False
    assert not rt.healthy()  # the active checker says down


def test_views_treat_old_or_failed_scrapes_as_unknown() -> None:
    clock = FakeClock()
    m = _model(clock)
    spec = m.engines["spec0"]
    v = m.view(clock.t).pairs[0].spec
    assert v.stale and v.stats.running is None and v.method == "ngram" and v.k == 5
    stats = EngineStats(
        at=clock.t,
        running=3,
        waiting=1,
        kv_usage=0.2,
        acceptance_rate=0.6,
        mean_acceptance_length=3.1,
        per_position=(0.8, 0.6),
        tpot_s=0.012,
    )
    spec.scrape = ScrapeState(stats=stats, stale=False, last_success=clock.t)
    with spec.track():
        v = m.view(clock.t + 1).pairs[0].spec
    assert not v.stale and v.stats is stats  # the scraped record itself, not a copy
    assert v.inflight == 1
    v = m.view(clock.t + 3.5).pairs[0].spec
    assert v.stale and v.stats.acceptance_rate is None  # too old: unknown, never zero
    spec.scrape = ScrapeState(stats=None, last_success=clock.t, last_error="timeout")
    assert m.view(clock.t).pairs[0].spec.stale
    spec.draining = True
    assert not m.view(clock.t).pairs[0].spec.usable


def test_pinned_route_is_in_the_view_and_state() -> None:
    clock = FakeClock()
    m = _model(clock)
    m.pinned = RouteOverride.BASE
    assert m.view(clock.t).pinned is RouteOverride.BASE
    state = m.state(clock.t)
    assert state["pinned"] == "base" and state["policy_state"] == {"policy": "always-spec"}


def test_a_policy_learns_the_pairs_method_when_the_runtime_is_built() -> None:
    """Before any request: a pinned request's answer or a peer's is then learned as the
    pair's method says (an EAGLE-3 pair is not taught by the n-gram replay)."""
    cfg = load_config(
        None, env={}, overrides={"models.0.pairs.0.spec.method": "eagle3", "models.0.pairs.0.spec.k": 3}
    )
    policy = AdaptivePolicy(cfg.models[0].routing)
    ModelRuntime.from_config(cfg.models[0], policy)
    assert (policy.estimator.method, policy.estimator.k) == ("eagle3", 3)
