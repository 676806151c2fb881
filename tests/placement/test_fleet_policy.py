"""Placement across a model's pairs (gateway.placement): specialisation, balance,
conversation affinity, pairs that join and leave, and one pair decided exactly as before."""

from __future__ import annotations

import random

from gateway.placement import FleetPolicy
from gateway.placement.fleet import pair_key
from gateway.placement.planner import Planner
from gateway.routing.adaptive import AdaptivePolicy
from gateway.routing.config import RoutingConfig
from gateway.routing.types import EngineView, ModelView, Outcome, PairView, RequestFeatures, Route

COPY = RequestFeatures("m", temperature=0.0, overlap=0.9, kind="edit", max_tokens=256)
CHAT = RequestFeatures("m", temperature=1.0, overlap=0.0, kind="chat", max_tokens=256)


def pair(i: int, spec_load: int = 0, base_load: int = 0) -> PairView:
    return PairView(
        EngineView(f"spec{i}", Route.SPEC, stale=True, inflight=spec_load, method="ngram", k=5),
        EngineView(f"base{i}", Route.BASE, stale=True, inflight=base_load),
        f"gpu{i}",
    )


def fleet(n: int = 4) -> tuple[FleetPolicy, list[PairView]]:
    policy = FleetPolicy(AdaptivePolicy(RoutingConfig(policy="adaptive")))
    policy.bind("ngram", 5)
    pairs = [pair(i) for i in range(n)]
    for p in pairs:
        policy.policy_of(p)
    return policy, pairs


def regimes(policy: FleetPolicy, spec: set[int], n: int, now: float = 0.0) -> None:
    """Put pairs ``spec`` in the speculative regime, the others in the plain one."""
    for i in range(n):
        policy.pairs[f"base{i}"].follow_leader(i in spec, now)
    policy.fleet = True
    policy._next_plan = float("inf")  # the test sets the regimes; no plan overrides them


def placed(policy: FleetPolicy, f: RequestFeatures, pairs: list[PairView], now: float = 1.0) -> str:
    d = policy.decide(f, ModelView("m", tuple(pairs)), now)
    return d.engine


def test_one_pair_decides_exactly_as_the_pairs_policy() -> None:
    """With one pair every decision and every lesson is the adaptive policy's own."""
    cfg = RoutingConfig(policy="adaptive")
    alone, wrapped = AdaptivePolicy(cfg), FleetPolicy(AdaptivePolicy(cfg))
    rng = random.Random(7)
    for i in range(400):
        now = i * 0.05
        f = RequestFeatures(
            "m", temperature=rng.random(), overlap=rng.random(), kind=rng.choice(["edit", "chat", "summary"])
        )
        p = pair(0, rng.randrange(0, 40), rng.randrange(0, 40))
        view = ModelView("m", (p,))
        a, b = alone.decide(f, view, now), wrapped.decide(f, view, now)
        assert a == b
        out = Outcome("m", a.route, a.engine, f.kind, f.temperature, True, 100, 200, 0.05, 0.006)
        alone.observe(out, now)
        wrapped.observe(out, now)
    assert alone.snapshot() == wrapped.snapshot()


def test_copy_heavy_requests_gather_on_speculating_pairs_and_chat_on_plain_ones() -> None:
    policy, _pairs = fleet(4)
    regimes(policy, {0, 1}, 4)
    loaded = [pair(i, *((30, 0) if i < 2 else (0, 30))) for i in range(4)]
    assert placed(policy, COPY, loaded).startswith("spec")
    assert placed(policy, CHAT, loaded).startswith("base")


def test_no_pair_fills_while_another_idles() -> None:
    """Requests of one class spread over the pairs of the same regime."""
    policy, _pairs = fleet(4)
    regimes(policy, set(), 4)
    load = {f"base{i}": 0 for i in range(4)}
    for n in range(200):
        views = [pair(i, 0, load[f"base{i}"]) for i in range(4)]
        load[placed(policy, CHAT, views, 1.0 + n * 1e-3)] += 1
    assert max(load.values()) - min(load.values()) <= 2


def test_a_conversation_stays_on_its_pair_while_costs_are_close() -> None:
    policy, _ = fleet(2)
    regimes(policy, set(), 2)
    talk = RequestFeatures("m", temperature=1.0, overlap=0.0, kind="chat", affinity=42)
    first = placed(policy, talk, [pair(0, 0, 20), pair(1, 0, 21)])
    assert first == "base0"
    # the other pair is now slightly lighter: the conversation stays
    assert placed(policy, talk, [pair(0, 0, 21), pair(1, 0, 20)], 2.0) == "base0"
    # ... but not on a pair much busier than another
    assert placed(policy, talk, [pair(0, 0, 250), pair(1, 0, 2)], 3.0) == "base1"
    # a request of no conversation takes the cheapest
    assert placed(policy, CHAT, [pair(0, 0, 21), pair(1, 0, 20)], 4.0) == "base1"


def test_a_new_pair_starts_from_the_models_learning_and_takes_requests() -> None:
    policy, _pairs = fleet(2)
    regimes(policy, set(), 2)
    for t in range(50):  # the model learns edit's acceptance from answers on pair 0
        out = Outcome("m", Route.SPEC, "spec0", "edit", 0.0, True, 100, 200, lookup_acceptance=0.9)
        policy.observe(out, float(t))
    learned = policy.primary.estimator.learner.snapshot(50.0)
    busy = [pair(0, 0, 40), pair(1, 0, 40)]
    new = pair(2)
    fresh = policy.policy_of(new)
    regimes(policy, set(), 3)  # the plan has every pair plain (chat only)
    assert placed(policy, CHAT, [*busy, new], 51.0) == "base2"  # the idle newcomer
    assert fresh is not policy.primary
    assert fresh.estimator.learner is policy.primary.estimator.learner
    assert fresh.estimator.learner.snapshot(50.0) == learned
    assert fresh.estimator.context is policy.primary.estimator.context
    assert fresh.controller is not policy.primary.controller  # its own regime and evidence


def test_a_pair_that_left_is_forgotten_and_never_chosen() -> None:
    policy, pairs = fleet(3)
    regimes(policy, set(), 3)
    talk = RequestFeatures("m", kind="chat", affinity=7)
    assert placed(policy, talk, [pair(0, 0, 5), pair(1, 0, 5), pair(2, 0, 0)]) == "base2"
    policy.forget("base2")
    assert "base2" not in policy.pairs and 7 not in policy.affinity
    for n in range(20):
        assert placed(policy, talk, [pair(0, 0, n), pair(1, 0, 5)], 2.0 + n) in {"base0", "base1"}
    policy.forget(pair_key(pairs[0]))  # the first pair's policy goes: another pair's takes over
    assert policy.primary is policy.pairs["base1"]
    assert placed(policy, talk, [pair(1, 0, 5)], 30.0) == "base1"


def step(spec: bool, batch: int) -> float:
    """A toy device: memory-bound up to 32, linear beyond; a spec step is 40 % dearer."""
    t = 6.0 + 0.05 * max(0, batch - 32) + 0.01 * batch
    return t * (1.4 if spec else 1.0)


def test_the_number_of_speculating_pairs_follows_the_traffic() -> None:
    def plan(es: list[float], qps: float) -> int:
        planner = Planner()
        for i, e in enumerate(es * (400 // len(es))):
            planner.note(i / qps, e, 3.0)
        p = planner.plan(400 / qps, 8, 0, step, 256)
        assert p is not None
        return p.speculating

    assert plan([3.0], 40.0) == 8  # all copy-heavy: every pair speculates
    assert plan([1.05], 40.0) == 0  # all chat: none does
    mixed = plan([3.0, 1.05], 400.0)  # half and half, busy: a share of the pairs
    assert 0 < mixed < 8
