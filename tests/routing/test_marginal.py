"""Per-request choices where the regime leaves room (idle pair, the other engine busy)."""

from __future__ import annotations

import pytest

from gateway.routing.adaptive import REASONS, AdaptivePolicy
from gateway.routing.config import RoutingConfig
from gateway.routing.marginal import marginal_costs, population_speedup
from gateway.routing.types import ModelView, RequestFeatures, Route
from tests.routing.conftest import CHAT_HOT, EDIT, SUMMARY, engine, view, with_

SPEC, BASE = engine(Route.SPEC), engine(Route.BASE)
EDIT_HOT = RequestFeatures("m", temperature=1.0, overlap=0.85, kind="edit", max_tokens=256)
CHATTY = (CHAT_HOT, CHAT_HOT, SUMMARY, CHAT_HOT, EDIT)  # mostly open chat: the pair falls back
COPYING = (EDIT, EDIT, SUMMARY)  # copy-heavy: the pair speculates
EDIT_WARM = RequestFeatures("m", temperature=0.7, overlap=0.85, kind="edit")
WARM = (EDIT_WARM, CHAT_HOT, SUMMARY)  # moderate acceptance: load decides
IDLE = view()
BASE_BUSY = view(base=with_(BASE, inflight=2))
SPEC_BUSY = view(spec=with_(SPEC, inflight=2))
HEAVY = view(base=with_(BASE, inflight=200))
DRAINING_SPEC = view(spec=with_(SPEC, inflight=150))


def warm(
    p: AdaptivePolicy, traffic: tuple[RequestFeatures, ...], mv: ModelView, gap_s: float, n: int
) -> float:
    t = 0.0
    for i in range(n):
        p.decide(traffic[i % len(traffic)], mv, t)
        t = round(t + gap_s, 6)
    return t


def fresh() -> AdaptivePolicy:
    return AdaptivePolicy(RoutingConfig(policy="adaptive"))


CASES = [
    # (name, warm-up traffic, its view, seconds between warm-up arrivals, count,
    #  then: a few requests at the pair before the last one, request, view, route, reasons)
    (
        "idle pair + edit T=0 while falling back",
        CHATTY,
        BASE_BUSY,
        4.0,
        30,
        (),
        EDIT,
        IDLE,
        Route.SPEC,
        {"idle_pair"},
    ),
    (
        # Its own gain is small (~3 % at batch 1): it takes it only when arrivals are rare.
        "idle pair + chat T=1 while speculating, rare arrivals",
        COPYING,
        SPEC_BUSY,
        120.0,
        20,
        (),
        CHAT_HOT,
        IDLE,
        Route.BASE,
        {"idle_pair"},
    ),
    (
        "idle pair + edit T=1: its small own gain does not pay for likely overlaps",
        CHATTY,
        BASE_BUSY,
        4.0,
        30,
        (),
        EDIT_HOT,
        IDLE,
        Route.BASE,
        {"low_acceptance", "below_break_even", "high_load"},
    ),
    (
        "spec busy with edits + chat arriving joins spec",
        CHATTY,
        BASE_BUSY,
        4.0,
        30,
        ((EDIT, IDLE), (EDIT, view(spec=with_(SPEC, inflight=1)))),
        CHAT_HOT,
        SPEC_BUSY,
        Route.SPEC,
        {"joins_busy_engine"},
    ),
    (
        "base busy with a chat + summary arriving, speculating: joins base",
        COPYING,
        SPEC_BUSY,
        120.0,
        20,
        ((CHAT_HOT, IDLE),),
        SUMMARY,
        view(base=with_(BASE, inflight=1)),
        Route.BASE,
        {"joins_busy_engine"},
    ),
    (
        "high load: the draining spec engine is not joined",
        WARM,
        HEAVY,
        0.01,
        400,
        (),
        EDIT,
        DRAINING_SPEC,
        Route.BASE,
        {"high_load", "below_break_even", "low_acceptance"},
    ),
    (
        "steady arrivals: no idle-pair gamble",
        CHATTY,
        BASE_BUSY,
        0.05,
        300,
        (),
        EDIT,
        IDLE,
        Route.BASE,
        {"low_acceptance", "below_break_even", "high_load"},
    ),
]


@pytest.mark.parametrize(
    ("name", "traffic", "warm_view", "gap", "n", "before", "req", "mv", "route", "reasons"),
    CASES,
    ids=[c[0] for c in CASES],
)
def test_per_request_choice(
    name: str,
    traffic: tuple[RequestFeatures, ...],
    warm_view: ModelView,
    gap: float,
    n: int,
    before: tuple[tuple[RequestFeatures, ModelView], ...],
    req: RequestFeatures,
    mv: ModelView,
    route: Route,
    reasons: set[str],
) -> None:
    p = fresh()
    t = warm(p, traffic, warm_view, gap, n)
    for f, v in before:
        p.decide(f, v, t)
        t += 0.5
    d = p.decide(req, mv, t)
    assert (d.route, d.reason) in {(route, r) for r in reasons}, (name, d)
    assert d.reason in REASONS


def test_marginal_costs_count_serialisation() -> None:
    def ts(b: float) -> float:
        return 6.0 if b > 0 else 0.0

    def tb(b: float) -> float:
        return 5.5 if b > 0 else 0.0

    # Spec busy, base idle: sending a plain-speed request to base adds a whole base step
    # to every spec request's cycle; joining spec costs it ~9 % of its own time.
    m = marginal_costs(ts, tb, spec_load=3, base_load=0, tokens_per_step=1.0, others_weight=1.0)
    assert m.prefers_spec
    assert m.own_spec_ms == pytest.approx(6.0) and m.own_base_ms == pytest.approx(11.5)
    # Idle pair: only its own time counts.
    m = marginal_costs(ts, tb, spec_load=0, base_load=0, tokens_per_step=1.0, others_weight=0.0)
    assert not m.prefers_spec and m.own_speedup == pytest.approx(5.5 / 6.0)
    m = marginal_costs(ts, tb, spec_load=0, base_load=0, tokens_per_step=3.0, others_weight=0.0)
    assert m.prefers_spec and m.own_speedup == pytest.approx(5.5 / 2.0)


def test_population_speedup_is_harmonic() -> None:
    # One request at E=4 and one at E=1: mean 1/E = 0.625.
    assert population_speedup(6.0, 5.5, 0.25 + 1.0, 2) == pytest.approx(5.5 / (6.0 * 0.625))
    assert population_speedup(6.0, 5.5, 0.0, 0) == 1.0


def test_snapshot_counts_new_reasons() -> None:
    p = fresh()
    warm(p, CHATTY, BASE_BUSY, 4.0, 30)
    p.decide(EDIT, IDLE, 200.0)
    assert p.snapshot()["reasons"].get("idle_pair") == 1  # type: ignore[union-attr]


def test_first_mode_comes_from_a_settled_mix() -> None:
    """A few open-chat requests first do not pin copy-heavy traffic in fallback."""
    p = fresh()
    t = warm(p, (CHAT_HOT,), BASE_BUSY, 0.5, 3)
    assert not p.mode.speculating
    for i in range(20):
        p.decide(COPYING[i % len(COPYING)], SPEC_BUSY, t)
        t += 0.5
    assert p.mode.speculating and p.mode.flips == 0
