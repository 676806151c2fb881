"""Per-pair series: each pair's regime and load, the fleet's counts; a pair that leaves the
view stops being exported, and a gone engine's own series end."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gateway.placement import FleetPolicy
from gateway.routing.adaptive import AdaptivePolicy
from gateway.routing.config import RoutingConfig
from gateway.routing.types import EngineStats, EngineView, ModelView, PairView, RequestFeatures, Route
from gateway.telemetry import GatewayTelemetry, ModelState
from tests.fakes import FakeClock

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _samples(tel: GatewayTelemetry) -> Samples:
    out = {}
    for fam in text_string_to_metric_families(tel.exposition().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def _of(s: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: v for (n, labels), v in s.items() if n == name}


def _pair(i: int, inflight: int = 0, running: float | None = None, waiting: float | None = None) -> PairView:
    stats = EngineStats(running=running, waiting=waiting)
    return PairView(
        EngineView(f"spec{i}", Route.SPEC, inflight=inflight, method="ngram", k=5, stats=stats),
        EngineView(f"base{i}", Route.BASE, inflight=1),
        f"gpu{i}",
    )


def _fleet(n: int) -> tuple[FleetPolicy, list[PairView]]:
    policy = FleetPolicy(AdaptivePolicy(RoutingConfig(policy="adaptive")))
    policy.bind("ngram", 5)
    pairs = [_pair(i) for i in range(n)]
    policy._next_plan = float("inf")  # the test sets the regimes; no plan overrides them
    policy.decide(RequestFeatures("m1"), ModelView("m1", tuple(pairs)), 0.0)  # the fleet leads
    return policy, pairs


def _pair_key(model: str, pair: str) -> tuple[tuple[str, str], ...]:
    return (("model", model), ("pair", pair))


def test_each_pair_exports_its_regime_which_follows_the_fleet(tel: GatewayTelemetry) -> None:
    policy, pairs = _fleet(3)
    view = ModelView("m1", tuple(pairs))
    tel.set_state_source(lambda: [ModelState("m1", view, policy.snapshot())])
    for i, spec in enumerate((True, False, True)):
        policy.pairs[f"base{i}"].follow_leader(spec, 0.0)
    policy.planned = 2
    s = _samples(tel)
    assert _of(s, "specgate_pair_speculating") == {
        _pair_key("m1", "base0"): 1.0,
        _pair_key("m1", "base1"): 0.0,
        _pair_key("m1", "base2"): 1.0,
    }
    assert s[("specgate_fleet_pairs", (("model", "m1"),))] == 3
    assert s[("specgate_fleet_speculating_pairs", (("model", "m1"),))] == 2
    assert s[("specgate_fleet_planned_speculating_pairs", (("model", "m1"),))] == 2

    policy.pairs["base0"].follow_leader(False, 10.0)  # pair 0 turns plain
    s = _samples(tel)
    assert s[("specgate_pair_speculating", _pair_key("m1", "base0"))] == 0.0
    assert s[("specgate_fleet_speculating_pairs", (("model", "m1"),))] == 1


def test_pair_load_counts_what_placement_counts(tel: GatewayTelemetry) -> None:
    """Per engine: the gateway's in-flight count or the scraped running + waiting if higher."""
    view = ModelView("m1", (_pair(0, inflight=2, running=5.0, waiting=3.0), _pair(1, inflight=4)))
    tel.set_state_source(lambda: [ModelState("m1", view, {"mode": "speculating"})])
    s = _samples(tel)
    assert _of(s, "specgate_pair_load_requests") == {
        _pair_key("m1", "base0"): 8.0 + 1.0,  # spec: the scrape's 5 + 3 > 2 in flight; base: 1
        _pair_key("m1", "base1"): 4.0 + 1.0,
    }
    spec0 = (("model", "m1"), ("pair", "base0"), ("route", "spec"))
    assert s[("specgate_pair_engine_running_requests", spec0)] == 5.0
    assert s[("specgate_pair_engine_waiting_requests", spec0)] == 3.0
    assert s[("specgate_pair_engine_inflight_requests", spec0)] == 2.0
    # two pairs and no fleet state yet (no request decided): no regime is guessed
    assert _of(s, "specgate_pair_speculating") == {}
    assert s[("specgate_fleet_pairs", (("model", "m1"),))] == 2


def test_one_pair_reads_the_models_mode_and_a_pair_without_usable_spec_runs_plain(
    tel: GatewayTelemetry,
) -> None:
    view = ModelView("m1", (_pair(0),))
    snap: dict[str, object] = {"mode": "speculating"}
    tel.set_state_source(lambda: [ModelState("m1", view, snap)])
    s = _samples(tel)
    assert s[("specgate_pair_speculating", _pair_key("m1", "base0"))] == 1.0
    assert s[("specgate_fleet_planned_speculating_pairs", (("model", "m1"),))] == 1.0
    snap["mode"] = "fallback"
    assert _samples(tel)[("specgate_pair_speculating", _pair_key("m1", "base0"))] == 0.0
    snap["mode"] = "speculating"
    p = _pair(0)
    view = ModelView("m1", (PairView(EngineView("spec0", Route.SPEC, healthy=False), p.base, p.device),))
    assert _samples(tel)[("specgate_pair_speculating", _pair_key("m1", "base0"))] == 0.0


def test_a_pair_that_leaves_the_view_stops_being_exported(tel: GatewayTelemetry) -> None:
    policy, pairs = _fleet(2)
    views = [ModelView("m1", tuple(pairs))]
    tel.set_state_source(lambda: [ModelState("m1", views[0], policy.snapshot())])
    assert {k[1] for k in _of(_samples(tel), "specgate_pair_load_requests")} == {
        ("pair", "base0"),
        ("pair", "base1"),
    }
    views[0] = ModelView("m1", (pairs[1],))  # pair 0 drains: out of the routing view
    policy.forget("base0")
    s = _samples(tel)
    names = {n for (n, _labels) in s if n.startswith("specgate_pair_")}
    assert names  # pair 1 is still exported
    assert all(dict(labels)["pair"] == "base1" for (n, labels) in s if n.startswith("specgate_pair_"))
    assert s[("specgate_fleet_pairs", (("model", "m1"),))] == 1


def test_a_gone_engines_series_end_and_its_label_is_free_again(
    tel: GatewayTelemetry, clock: FakeClock
) -> None:
    m = tel.metrics
    for e in ("spec0", "base0", "spec1"):
        m.inflight.labels(m.engine(e)).set(3)
        tel.record_scrape(e, True, 0.01)
        m.upstream_failures.labels(m.engine(e), "timeout").inc()
    clock.advance(5.0)
    tel.forget_engines(["spec0", "base0"])
    s = _samples(tel)
    engines = {dict(labels).get("engine") for (_n, labels) in s} - {None}
    assert engines == {"spec1"}
    assert s[("specgate_engine_scrape_age_seconds", (("engine", "spec1"),))] == 5.0

    small = GatewayTelemetry(clock=clock)
    small.metrics.engine = type(m.engine)(1)  # room for one engine label
    assert small.metrics.engine("a") == "a" and small.metrics.engine("b") == "other"
    small.forget_engines(["a"])
    assert small.metrics.engine("b") == "b"
