"""Table-driven tests of the adaptive decision core (pure: fake clock, fake views)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from gateway.routing.adaptive import REASONS, AdaptivePolicy
from gateway.routing.config import RoutingConfig
from gateway.routing.factory import build_policy
from gateway.routing.rules import NoEngineAvailable
from gateway.routing.types import ModelView, Outcome, RequestFeatures, Route, RouteOverride
from tests.routing.conftest import CHAT_HOT, EDIT, SUMMARY, engine, view, with_

SPEC, BASE = engine(Route.SPEC), engine(Route.BASE)


def policy(**kw: object) -> AdaptivePolicy:
    return AdaptivePolicy(RoutingConfig(policy="adaptive", **kw))  # type: ignore[arg-type]


CASES = [
    # (name, features, model view, expected route, allowed reasons)
    ("low load copy-heavy T=0", EDIT, view(), Route.SPEC, {"predicted_faster"}),
    (
        "low load copy-heavy, one each",
        EDIT,
        view(with_(SPEC, inflight=1), with_(BASE, inflight=1)),
        Route.SPEC,
        None,
    ),
    ("heavy load copy-heavy", EDIT, view(base=with_(BASE, inflight=128)), Route.BASE, {"high_load"}),
    (
        "heavy scraped load",
        EDIT,
        view(base=with_(BASE, running=100.0, waiting=20.0)),
        Route.BASE,
        {"high_load"},
    ),
    ("open chat T=1 idle", CHAT_HOT, view(), Route.BASE, {"low_acceptance", "predicted_slower"}),
    (
        "refused params",
        replace(EDIT, refused_params=("min_p",)),
        view(),
        Route.BASE,
        {"refused_params"},
    ),
    ("spec engine down", EDIT, view(spec=with_(SPEC, healthy=False)), Route.BASE, {"spec_down"}),
    ("spec engine draining", EDIT, view(spec=with_(SPEC, draining=True)), Route.BASE, {"spec_down"}),
    ("base down, chat", CHAT_HOT, view(base=with_(BASE, healthy=False)), Route.SPEC, {"base_down"}),
    ("forced spec", replace(CHAT_HOT, forced=Route.SPEC), view(), Route.SPEC, {"forced"}),
    (
        "stale metrics → prior",
        EDIT,
        view(with_(SPEC, stale=True), with_(BASE, stale=True)),
        Route.SPEC,
        {"prior"},
    ),
    (
        "stale metrics chat → prior",
        CHAT_HOT,
        view(with_(SPEC, stale=True), with_(BASE, stale=True)),
        Route.BASE,
        {"prior"},
    ),
]


@pytest.mark.parametrize(("name", "features", "mv", "route", "reasons"), CASES, ids=[c[0] for c in CASES])
def test_decision_table(
    name: str, features: RequestFeatures, mv: ModelView, route: Route, reasons: set[str] | None
) -> None:
    d = policy().decide(features, mv, now=0.0)
    assert d.route is route, (name, d)
    if reasons is not None:
        assert d.reason in reasons, (name, d.reason)
    assert d.reason in REASONS
    assert d.engine == (mv.pairs[0].spec.name if route is Route.SPEC else mv.pairs[0].base.name)


def test_refused_params_never_movable() -> None:
    d = policy().decide(replace(EDIT, refused_params=("logit_bias",)), view(), 0.0)
    assert d.fallback is None


def test_all_down_raises() -> None:
    with pytest.raises(NoEngineAvailable):
        policy().decide(EDIT, view(with_(SPEC, healthy=False), with_(BASE, healthy=False)), 0.0)


def test_pinned_model() -> None:
    mv = ModelView("m", view().pairs, pinned=RouteOverride.BASE)
    d = policy().decide(EDIT, mv, 0.0)
    assert (d.route, d.reason) == (Route.BASE, "pinned")


def test_load_flips_the_answer_for_the_same_request() -> None:
    """Acceptance alone is a poor switch: the same copy-heavy request flips with load."""
    routes = []
    for b in (0, 2, 8, 32, 128):
        p = policy()
        routes.append(p.decide(EDIT, view(base=with_(BASE, inflight=b)), 0.0).route)
    assert routes[0] is Route.SPEC and routes[-1] is Route.BASE
    assert routes == sorted(routes, key=lambda r: r is Route.BASE)  # monotone in load


def test_busy_spec_engine_attracts_copy_heavy_traffic() -> None:
    # With the spec engine already stepping, adding one more request there is cheap.
    mv = view(with_(SPEC, inflight=8), with_(BASE, inflight=8))
    assert policy().decide(EDIT, mv, 0.0).route is Route.SPEC
    assert policy().decide(CHAT_HOT, mv, 0.0).route is Route.BASE


def run(
    p: AdaptivePolicy, f: RequestFeatures, mv: ModelView, t0: float, t1: float, dt: float = 0.1
) -> list[tuple[float, Route, str]]:
    out = []
    t = t0
    while t < t1:
        d = p.decide(f, mv, t)
        out.append((t, d.route, d.reason))
        t = round(t + dt, 6)
    return out


def test_acceptance_collapse_falls_back_then_recovers_through_probes() -> None:
    p = policy(min_dwell_s=5.0, probe_interval_s=2.0)
    healthy = view(with_(SPEC, inflight=2, mean_acceptance_length=4.6), with_(BASE, inflight=4))
    collapsed = view(with_(SPEC, inflight=2, mean_acceptance_length=1.05), with_(BASE, inflight=4))
    before = run(p, EDIT, healthy, 0.0, 10.0)
    assert all(r is Route.SPEC for _, r, _ in before)
    during = run(p, EDIT, collapsed, 10.0, 30.0)
    first_base = next(t for t, r, _ in during if r is Route.BASE)
    assert first_base - 10.0 <= 5.0  # plain within a bounded time
    tail = [x for x in during if x[0] >= 20.0]
    assert all(r is Route.BASE or why == "probe" for _, r, why in tail)
    probes = [t for t, _, why in during if why == "probe"]
    assert probes and len(probes) <= 0.1 * len(during)  # measured, but bounded
    assert p.snapshot()["modes"]["edit/t0"]["mode"] == "fallback"  # type: ignore[index]
    after = run(p, EDIT, healthy, 30.0, 50.0)
    back = next(t for t, r, why in after if r is Route.SPEC and why != "probe")
    assert back - 30.0 <= 12.0  # recovery noticed within dwell + probe interval
    assert all(r is Route.SPEC for t, r, _ in after if t >= back)


def test_no_flapping_under_noise() -> None:
    import random

    rng = random.Random(7)
    p = policy()
    flips_seen = []
    last = None
    t = 0.0
    for _ in range(2000):
        al = 3.2 * (1 + rng.uniform(-0.15, 0.15))  # noisy live acceptance around a steady truth
        b = rng.choice((2, 3, 4))
        mv = view(with_(SPEC, inflight=b, mean_acceptance_length=al), with_(BASE, inflight=b))
        d = p.decide(SUMMARY, mv, t)
        if d.reason != "probe":
            if last is not None and d.route is not last:
                flips_seen.append(t)
            last = d.route
        t += 0.05
    modes = p.snapshot()["modes"]
    assert all(m["flips"] <= 1 for m in modes.values())  # type: ignore[union-attr]
    assert len(flips_seen) <= 2


def test_learning_from_outcomes_moves_a_class() -> None:
    """A class predicted copy-heavy whose answers turn out not to copy goes plain."""
    p = policy()
    mv = view(base=with_(BASE, inflight=1))
    assert p.decide(EDIT, mv, 0.0).route is Route.SPEC
    for i in range(40):
        p.observe(
            Outcome("m", Route.SPEC, "spec", "edit", 0.0, ok=True, lookup_acceptance=0.01),
            float(i),
        )
    routes = [p.decide(EDIT, mv, 40.0 + i).route for i in range(20)]
    assert routes[-1] is Route.BASE
    learned = p.snapshot()["learned"]
    assert learned["edit/t0"]["tokens_per_step"] < 1.1  # type: ignore[index]


def test_snapshot_is_json_and_bounded() -> None:
    p = policy(recent_decisions=8)
    for i in range(50):
        p.decide(EDIT if i % 2 else CHAT_HOT, view(), float(i))
    snap = p.snapshot()
    json.dumps(snap)
    assert len(snap["recent_decisions"]) == 8  # type: ignore[arg-type]
    assert {"modes", "break_even_tokens_per_step", "learned", "probe_share", "step_scale"} <= set(snap)


def test_unknown_kind_folded_into_bounded_keys() -> None:
    p = policy()
    for i in range(200):
        p.decide(replace(CHAT_HOT, kind=f"weird-{i}"), view(), float(i))
    assert len(p.modes) <= 1


def test_measured_latency_corrects_step_profile() -> None:
    """A spec engine measured far slower than the roofline stops getting traffic."""
    p = policy()
    slow = view(
        with_(SPEC, inflight=1, mean_acceptance_length=4.6, tpot_s=0.03),
        with_(BASE, inflight=0),
    )
    for i in range(30):
        # New scrape values each second (the fit runs once per new scrape).
        mv = view(
            with_(slow.pairs[0].spec, tpot_s=0.05 + i * 1e-6),
            with_(slow.pairs[0].base, tpot_s=0.012 + i * 1e-6),
        )
        p.decide(EDIT, mv, float(i))
    assert p.scale_spec > 4.0
    idle = view(with_(slow.pairs[0].spec, inflight=0), with_(slow.pairs[0].base, inflight=0))
    assert p.decide(EDIT, idle, 31.0).route is Route.BASE


def test_factory_builds_adaptive() -> None:
    assert isinstance(build_policy(RoutingConfig(policy="adaptive")), AdaptivePolicy)


def test_eagle_method_uses_model_prior_and_reported_acceptance() -> None:
    p = policy()
    mv = view(with_(SPEC, method="eagle3", k=3))
    d0 = p.decide(CHAT_HOT, mv, 0.0)
    for i in range(40):
        p.observe(
            Outcome("m", Route.SPEC, "spec", "chat", 1.0, ok=True, reported_mean_acceptance_length=1.1),
            float(i),
        )
    d1 = p.decide(CHAT_HOT, mv, 50.0)
    assert d1.predicted_acceptance is not None and d0.predicted_acceptance is not None
    assert d1.predicted_acceptance < d0.predicted_acceptance
