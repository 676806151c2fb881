"""Table-driven tests of the adaptive decision core (pure: fake clock, fake views)."""

from __future__ import annotations

import itertools
import json
import math
import random
from dataclasses import replace

import pytest

from gateway.routing.adaptive import AdaptivePolicy
from gateway.routing.adaptive.policy import LOOKUP_DRAFTS_KEY
from gateway.routing.config import RoutingConfig
from gateway.routing.factory import build_policy
from gateway.routing.rules import NoEngineAvailable
from gateway.routing.types import Decision, ModelView, Outcome, Reason, RequestFeatures, Route, RouteOverride
from tests.routing.conftest import CHAT_HOT, EDIT, SUMMARY, engine, view, with_

SPEC, BASE = engine(Route.SPEC), engine(Route.BASE)
CHAT_COOL = RequestFeatures("m", temperature=0.3, overlap=0.05, kind="chat")
EDIT_WARM = RequestFeatures("m", temperature=0.7, overlap=0.85, kind="edit")
# A mixed stream: copy-heavy edits, summaries, open chat; temperatures 0..1.
MIXED = (EDIT, CHAT_HOT, SUMMARY, EDIT_WARM, CHAT_COOL)
# Warmer traffic: moderate acceptance, where load decides.
WARM = (EDIT_WARM, CHAT_HOT, SUMMARY)
MODERATE = (EDIT_WARM, SUMMARY)


def policy(**kw: object) -> AdaptivePolicy:
    return AdaptivePolicy(RoutingConfig(policy="adaptive", **kw))  # type: ignore[arg-type]


def warm(
    p: AdaptivePolicy,
    traffic: tuple[RequestFeatures, ...],
    mv: ModelView,
    t0: float = 0.0,
    interval: float = 0.1,
) -> float:
    """Feed 300 requests of steady traffic (by default 10 req/s, a busy pair) so the mix and
    the mode settle, each request's outcome measuring the acceptance the policy expected of
    it; returns the time."""
    t = t0
    for i in range(300):
        f = traffic[i % len(traffic)]
        d = p.decide(f, mv, t)
        if d.predicted_acceptance is not None:
            accepted = max(0.0, min(1.0, (d.predicted_acceptance - 1.0) / p.estimator.k))
            p.observe(
                Outcome("m", d.route, d.engine, f.kind, f.temperature, ok=True, lookup_acceptance=accepted), t
            )
        t = round(t + interval, 6)
    return t


QUIET = 4.0  # one request per 4 s: the pair idles between requests
CASES = [
    # (name, warm-up traffic or None, request, model view, expected route, allowed reasons)
    # A fresh gateway knows only its prior, and says so.
    ("fresh: copy-heavy T=0", None, EDIT, view(), Route.SPEC, {"prior"}),
    ("fresh: open chat T=1", None, CHAT_HOT, view(), Route.BASE, {"prior"}),
    # Once acceptance was measured, the reasons name what the measurement showed.
    ("busy: copy-heavy T=0", (EDIT,), EDIT, view(with_(SPEC, inflight=8)), Route.SPEC, {"predicted_faster"}),
    # A quiet pair idles between requests: each takes the engine fastest for it.
    ("quiet: copy-heavy T=0", (EDIT,), EDIT, view(), Route.SPEC, {"idle_pair"}),
    ("quiet mixed: copy-heavy T=0", MIXED, EDIT, view(), Route.SPEC, {"idle_pair"}),
    ("quiet mixed: open chat T=1", MIXED, CHAT_HOT, view(), Route.BASE, {"idle_pair"}),
    (
        "heavy load warm traffic",
        WARM,
        EDIT,
        view(base=with_(BASE, inflight=200)),
        Route.BASE,
        {"high_load"},
    ),
    (
        "heavy scraped load",
        WARM,
        EDIT,
        view(base=with_(BASE, running=180.0, waiting=40.0)),
        Route.BASE,
        {"high_load"},
    ),
    (
        "busy: open chat stream T=1",
        (CHAT_HOT,),
        CHAT_HOT,
        view(base=with_(BASE, inflight=8)),
        Route.BASE,
        {"low_acceptance"},
    ),
    (
        "refused params",
        None,
        replace(EDIT, refused_params=("min_p",)),
        view(),
        Route.BASE,
        {"refused_params"},
    ),
    ("spec engine down", None, EDIT, view(spec=with_(SPEC, healthy=False)), Route.BASE, {"spec_down"}),
    ("spec engine draining", None, EDIT, view(spec=with_(SPEC, draining=True)), Route.BASE, {"spec_down"}),
    ("base down, chat", None, CHAT_HOT, view(base=with_(BASE, healthy=False)), Route.SPEC, {"base_down"}),
    ("forced spec", None, replace(CHAT_HOT, forced=Route.SPEC), view(), Route.SPEC, {"forced"}),
    (
        "stale → prior",
        None,
        EDIT,
        view(with_(SPEC, stale=True), with_(BASE, stale=True)),
        Route.SPEC,
        {"prior"},
    ),
    (
        "stale chat → prior",
        None,
        CHAT_HOT,
        view(with_(SPEC, stale=True), with_(BASE, stale=True)),
        Route.BASE,
        {"prior"},
    ),
]


@pytest.mark.parametrize(
    ("name", "traffic", "features", "mv", "route", "reasons"), CASES, ids=[c[0] for c in CASES]
)
def test_decision_table(
    name: str,
    traffic: tuple[RequestFeatures, ...] | None,
    features: RequestFeatures,
    mv: ModelView,
    route: Route,
    reasons: set[str],
) -> None:
    p = policy()
    t = warm(p, traffic, mv, interval=QUIET if name.startswith("quiet") else 0.1) if traffic else 0.0
    d = p.decide(features, mv, t)
    assert d.route is route, (name, d)
    assert d.reason in reasons, (name, d.reason)
    assert isinstance(d.reason, Reason)  # one vocabulary
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


def test_load_flips_the_answer_for_the_same_traffic() -> None:
    """Acceptance alone is a poor switch: the same traffic flips from spec to plain with load."""
    routes = []
    for b in (0, 8, 32, 128, 256):
        p = policy()
        mv = view(base=with_(BASE, inflight=b))
        t = warm(p, MODERATE, mv)
        routes.append(p.decide(EDIT, mv, t).route)
    assert routes[0] is Route.SPEC and routes[-1] is Route.BASE
    assert routes == sorted(routes, key=lambda r: r is Route.BASE)  # monotone in load


def test_no_split_between_engines_of_a_pair() -> None:
    """In the speculating regime even a poor request joins spec: splitting runs both steps."""
    p = policy()
    mv = view(with_(SPEC, inflight=4))
    t = warm(p, MIXED, mv)
    assert p.decide(CHAT_HOT, mv, t).route is Route.SPEC


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
    p = policy(probe_interval_s=2.0)
    healthy = view(with_(SPEC, inflight=64, tokens_per_step=2.2))
    collapsed = view(with_(SPEC, inflight=64, tokens_per_step=1.05))
    idle_spec = view(with_(SPEC, inflight=0), with_(BASE, inflight=64))  # nothing measured on spec
    idle_pair = view(with_(SPEC, inflight=0), with_(BASE, inflight=0))  # the plain engine idles
    before = run(p, EDIT, healthy, 0.0, 20.0)
    assert all(r is Route.SPEC for _, r, _ in before)
    during = run(p, EDIT, collapsed, 20.0, 50.0)
    first_base = next(t for t, r, _ in during if r is Route.BASE)
    # plain within a bounded time: the live correction's 10-s half-life, then the evidence
    # to flip (within the 30 s a switch is allowed; 28.6 s here)
    assert first_base - 20.0 <= 30.0
    assert p.snapshot()["mode"] == "fallback"
    # Nothing goes to spec now, so nothing is measured. A probe while the plain engine is
    # busy would make its 64 requests pay both engines' steps: none is sent then.
    busy = run(p, EDIT, idle_spec, 50.0, 60.0)
    assert all(r is Route.BASE for _, r, _ in busy)
    # When the plain engine idles, probes keep a small share on spec.
    quiet = [
        x
        for t in range(60, 70)
        for x in run(p, EDIT, idle_spec, t, t + 0.9) + run(p, EDIT, idle_pair, t + 0.9, t + 1.0)
    ]
    probes = [t for t, _, why in quiet if why == "probe"]
    assert probes and len(probes) <= 0.1 * len(quiet)  # measured, but bounded
    assert all(r is Route.BASE or why == "probe" for _, r, why in quiet)
    # A probe shows acceptance is back: the mode returns to speculating.
    after = run(p, EDIT, healthy, 70.0, 110.0)
    back = next(t for t, r, why in after if r is Route.SPEC and why != "probe")
    # The live correction is smoothed (10-s half-life): a recovery shows within the 30 s a
    # switch is allowed.
    assert back - 70.0 <= 30.0
    assert all(r is Route.SPEC for t, r, _ in after if t >= back)


def test_no_flapping_under_noise() -> None:
    rng = random.Random(7)
    p = policy()
    t = 0.0
    routes = []
    for i in range(3000):
        tps = 2.0 * (1 + rng.uniform(-0.2, 0.2))  # noisy live acceptance around a steady truth
        b = rng.choice((20, 24, 28))
        mv = view(with_(SPEC, inflight=b, tokens_per_step=tps), with_(BASE, inflight=0))
        d = p.decide(MIXED[i % len(MIXED)], mv, t)
        if d.reason != "probe":
            routes.append(d.route)
        t += 0.05
    changes = sum(1 for a, b in itertools.pairwise(routes) if a is not b)
    assert p.controller.mode.flips <= 1 and changes <= 1


def test_learning_from_outcomes_moves_traffic() -> None:
    """Requests predicted copy-heavy whose answers turn out not to copy go plain."""
    p = policy()
    mv = view(base=with_(BASE, inflight=64))
    assert p.decide(EDIT, mv, 0.0).route is Route.SPEC
    for i in range(40):
        p.observe(Outcome("m", Route.SPEC, "spec", "edit", 0.0, ok=True, lookup_acceptance=0.01), float(i))
    routes = run(p, EDIT, mv, 40.0, 70.0)
    assert routes[-1][1] is Route.BASE
    learned = p.snapshot()["learned"]
    assert learned["edit/t0"]["tokens_per_step"] < 1.1  # type: ignore[index]


def test_snapshot_is_json_and_bounded() -> None:
    p = policy(recent_decisions=8)
    for i in range(50):
        p.decide(EDIT if i % 2 else CHAT_HOT, view(), float(i))
    snap = p.snapshot()
    json.dumps(snap)
    assert len(snap["recent_decisions"]) == 8  # type: ignore[arg-type]
    assert {"mode", "modes", "break_even_tokens_per_step", "learned", "probe_share", "step_scale"} <= set(
        snap
    )


def test_the_band_widens_with_a_mixed_windows_sampling_error() -> None:
    """Traffic whose requests accept very differently (copy-heavy edits beside open chat)
    gives a prediction that a window of a few requests reads only roughly: the band widens
    by its standard error. Uniform traffic leaves it as configured."""
    busy = view(with_(SPEC, inflight=8))
    noises = {}
    for name, traffic in (("mixed", (EDIT, CHAT_HOT)), ("uniform", (EDIT,))):
        p = policy()
        warm(p, traffic, busy)
        modes = p.snapshot()["modes"]
        assert isinstance(modes, dict)
        noises[name] = modes["all"]["prediction_noise"]
    assert noises["uniform"] == 0.0
    assert noises["mixed"] > 0.02


def test_unknown_kinds_fold_into_bounded_keys() -> None:
    p = policy()
    for i in range(200):
        p.decide(replace(CHAT_HOT, kind=f"weird-{i}"), view(), float(i))
        p.observe(
            Outcome("m", Route.BASE, "base", f"weird-{i}", 1.0, ok=True, lookup_acceptance=0.0), float(i)
        )
    assert set(p.snapshot()["learned"]) == {"chat/t3"}  # type: ignore[arg-type]


def _run_alone(
    p: AdaptivePolicy, spec_engine: bool, factor: float, t0: float, seconds: int
) -> list[Decision]:
    """``seconds`` of copy-heavy edits, 10 a second, while one engine runs 8 requests alone
    with steps ``factor`` x the profile's (a new scrape every second)."""
    out = []
    for i in range(seconds):
        if spec_engine:
            ms = p.estimator.steps.step_ms(9.0, p.estimator.q_mix()) + p.estimator.steps.spec_extra_ms(
                "ngram", p.estimator.k, 9.0
            )
            mv = view(with_(SPEC, inflight=8, step_s=factor * ms / 1000 + i * 1e-9), with_(BASE, inflight=0))
        else:
            ms = p.estimator.steps.step_ms(9.0, 1.0)
            mv = view(with_(SPEC, inflight=0), with_(BASE, inflight=8, step_s=factor * ms / 1000 + i * 1e-9))
        out += [p.decide(EDIT, mv, t0 + i + j / 10) for j in range(10)]
    return out


def test_a_slow_spec_engine_is_compared_with_plain_measured_and_loses_its_traffic() -> None:
    """Spec measured 10x slower than the profile: the plain engine, never measured, is at
    first assumed as slow (same device), so the pair explores it once (its streams move);
    plain then measures as the profile says, and spec loses its traffic for good."""
    p = policy()
    first = _run_alone(p, True, 10.0, 0.0, 10)
    explored = [d for d in first if d.reason == Reason.EXPLORE]
    assert explored and all(d.route is Route.BASE for d in explored)
    assert explored[0].move_from is Route.SPEC
    assert p.estimator.live.scale_spec > 4.0
    after = _run_alone(p, False, 1.0, 10.0, 30)
    assert p.estimator.live.scale(False, 9.0) == pytest.approx(1.0, rel=0.15)
    assert not p.controller.mode.speculating and after[-1].route is Route.BASE
    assert not any(d.reason == Reason.EXPLORE for d in after[-100:])  # explored once


def test_a_slower_gpu_explores_plain_once_and_goes_back_to_spec() -> None:
    """Both engines 2x slower than the profile (another GPU): once plain measured 2x as
    well, the pair is back on spec, where copy-heavy edits are faster."""
    p = policy()
    _run_alone(p, True, 2.0, 0.0, 10)
    assert not p.controller.mode.speculating  # exploring
    after = _run_alone(p, False, 2.0, 10.0, 30)
    assert p.controller.mode.speculating and after[-1].route is Route.SPEC
    assert p.estimator.live.scale(True, 9.0) == pytest.approx(p.estimator.live.scale(False, 9.0), rel=0.1)


def test_a_spec_engine_on_the_profile_is_not_explored() -> None:
    p = policy()
    decisions = _run_alone(p, True, 1.0, 0.0, 20)
    assert p.controller.mode.speculating and not any(d.reason == Reason.EXPLORE for d in decisions)


def test_steps_long_because_they_prefill_are_not_read_as_slow_decoding() -> None:
    """Steps that spend half their time prefilling admitted prompts are twice as long as
    the profile's decode step: the fit takes the prefill out (the scale stays near 1), and
    the prefill is priced into both regimes alike instead."""
    p = policy()
    c = p.estimator.steps.prefill_ms_per_token()
    load = 16.0
    decode = p.estimator.steps.step_ms(load, 6) + p.estimator.steps.spec_extra_ms("ngram", 5, load)
    prefill_tps = 0.5 / (c / 1000.0)  # half of the engine's time
    for i in range(80):  # the ratio settles on a 10-s half-life
        mv = view(
            with_(
                SPEC,
                inflight=int(load) - 1,
                step_s=2 * decode / 1000 + i * 1e-9,
                prefill_tps=prefill_tps,
                generation_tps=prefill_tps / 4,  # prompts 4x the answers
            ),
            with_(BASE, inflight=0, prefill_tps=0.0),
        )
        for j in range(10):
            p.decide(EDIT, mv, i + j / 10)
    assert 0.8 < p.estimator.live.scale_spec < 1.25
    alone = p.estimator.regime(load)
    assert p.estimator.live.prefill_per_token == pytest.approx(4.0, rel=0.02)
    assert alone.shared_ms == pytest.approx(c * load * p.estimator.live.prefill_per_token)
    assert alone.base_ms - alone.shared_ms == pytest.approx(
        p.estimator.steps.step_ms(load, 1) * p.estimator.live.scale_base
    )


def test_a_request_that_met_a_rising_load_does_not_teach_the_bias() -> None:
    """A cold start at high QPS: the first requests were predicted on an idle pair and ran
    on a full one. Their time per token measured the load's rise, not the model's error;
    requests that ran at the load they found do count."""
    p = policy()

    def served(t0: float, inflight: int, tpot: float) -> None:
        d = p.decide(EDIT, view(with_(SPEC, inflight=inflight), with_(BASE, inflight=0)), t0)
        assert d.route is Route.SPEC and d.predicted_tpot_s is not None
        for i in range(1, 20):  # arrivals during its 2-s life find the pair as it then is
            p.decide(
                EDIT, view(with_(SPEC, inflight=inflight + i * 10), with_(BASE, inflight=0)), t0 + i / 10
            )
        out = Outcome(
            "m", Route.SPEC, "spec", "edit", 0.0, ok=True, completion_tokens=200,
            ttft_s=0.05, tpot_s=tpot, predicted_tpot_s=d.predicted_tpot_s,
        )  # fmt: skip
        p.observe(out, t0 + 0.05 + tpot * 199)

    served(0.0, 0, 0.010)  # the load rose from 0 to 190 in flight while it ran
    assert p.estimator.bias.samples[Route.SPEC] == 0

    def steady(t0: float) -> None:
        d = p.decide(EDIT, view(with_(SPEC, inflight=12), with_(BASE, inflight=0)), t0)
        assert d.predicted_tpot_s is not None
        for i in range(1, 20):
            p.decide(EDIT, view(with_(SPEC, inflight=12 + i % 3), with_(BASE, inflight=0)), t0 + i / 10)
        out = Outcome(
            "m", Route.SPEC, "spec", "edit", 0.0, ok=True, completion_tokens=200,
            ttft_s=0.05, tpot_s=d.predicted_tpot_s, predicted_tpot_s=d.predicted_tpot_s,
        )  # fmt: skip
        p.observe(out, t0 + 2.0)

    steady(100.0)
    assert p.estimator.bias.samples[Route.SPEC] == 1


def test_the_error_measured_at_full_load_decides_there_not_the_one_learned_light() -> None:
    """Seen on a real H200: the EAGLE-3 engine ran 14 % slower than modelled at light load
    and far cheaper than modelled with 64 requests in its batch. A load-blind correction
    learned light (and no measurement from the full, queueing engine) priced the peak as a
    loss, and the pair went to plain where speculation was 20 % faster. Per load, each
    measurement speaks for the load it was taken at, queued requests included."""
    p = policy()
    light = view(with_(SPEC, inflight=2, running=2.0, waiting=0.0))
    full = view(with_(SPEC, inflight=200, running=64.0, waiting=136.0))
    t = warm(p, (EDIT,), light)  # a busy stream at light load sets the mix and the mode

    def serve(mv: ModelView, factor: float, t: float, n: int = 60) -> float:
        for _ in range(n):
            d = p.decide(EDIT, mv, t)
            assert d.route is Route.SPEC and d.predicted_tpot_s is not None
            out = Outcome(
                "m", Route.SPEC, "spec", "edit", 0.0, ok=True, completion_tokens=200,
                ttft_s=0.05, tpot_s=d.predicted_tpot_s * factor, predicted_tpot_s=d.predicted_tpot_s,
            )  # fmt: skip
            p.observe(out, t + 0.05 + d.predicted_tpot_s * factor * 199)
            # plain, measured at the same load (before, or by another replica), runs as modelled
            p.estimator.bias.observe(Route.BASE, 0.01, 0.01, 200, t, p.estimator.loads.entries[-1][1])
            t = round(t + 0.1, 6)
        return t

    t = serve(light, 1.15, t)
    for _ in range(30):  # the batch fills (the cap is learned from the scrapes)
        p.decide(EDIT, full, t)
        t = round(t + 0.1, 6)
    blind = p.estimator.last_costs
    assert blind is not None
    t = serve(full, 0.7, t)  # the full engine, queue and all, runs 30 % under the model
    d = p.decide(EDIT, full, t)
    assert (
        p.estimator.bias.factor(Route.SPEC, t, 2.0) > 1.0
    )  # (the light gap, toward the offset of both loads)
    assert p.estimator.bias.factor(Route.SPEC, t, 64.0) == pytest.approx(0.7, rel=0.1)
    assert p.estimator.last_costs is not None
    assert p.estimator.last_costs.speedup > 1.3 * blind.speedup  # the peak is priced as measured
    assert d.route is Route.SPEC


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


def test_replicas_choose_the_least_loaded_pair_then_the_engine() -> None:
    from gateway.routing.types import EngineView, PairView

    def pair(tag: str, load: int) -> PairView:
        s: EngineView = with_(SPEC, name=f"{tag}-spec", inflight=load)
        b: EngineView = with_(BASE, name=f"{tag}-base", inflight=load)
        return PairView(s, b, device=tag)

    mv = ModelView("m", (pair("gpu0", 40), pair("gpu1", 2)))
    d = policy().decide(EDIT, mv, 0.0)
    assert d.engine == "gpu1-spec" and d.fallback == "gpu1-base"


def test_a_flip_hands_over_at_a_moment_the_old_engine_is_idle() -> None:
    """A flip costs its drain (both engines step while the old one's requests finish).
    When the old engine is down to its last request it is about to idle: new requests wait
    for that, at most one request duration. (The evidence threshold is out of reach so that
    the mode stays where the test puts it.)"""
    p = policy(switch_evidence=100.0)
    last_one = view(with_(SPEC, inflight=1))
    t = warm(p, (EDIT,), view(with_(SPEC, inflight=6)))  # a busy pair
    assert p.decide(EDIT, last_one, t).route is Route.SPEC
    p.controller.mode.speculating, p.controller.mode.last_flip = (
        False,
        t,
    )  # the mode flips (whatever the cause)
    d = p.decide(CHAT_HOT, last_one, t + 0.1)
    assert (d.route, d.reason) == (Route.SPEC, "handover")
    idle = view(with_(SPEC, inflight=0), with_(BASE, inflight=0))
    assert p.decide(CHAT_HOT, idle, t + 0.2).route is Route.BASE  # free: nothing drains
    assert p.decide(CHAT_HOT, last_one, t + 0.3).route is Route.BASE  # and it stays there


def test_a_handover_waits_at_most_one_request_duration() -> None:
    p = policy(switch_evidence=100.0)
    last_one = view(with_(SPEC, inflight=1))
    t = warm(p, (EDIT,), view(with_(SPEC, inflight=6)))  # a busy pair
    p.controller.mode.speculating, p.controller.mode.last_flip = False, t
    assert p.decide(CHAT_HOT, last_one, t + 0.5).reason == "handover"
    assert p.decide(CHAT_HOT, last_one, t + 2.5).route is Route.BASE  # 2 s: the prior duration


def test_a_busy_old_engine_is_not_fed_after_a_flip() -> None:
    """With several requests still running, feeding the old engine would stretch its drain
    by a new request's whole life: the switch is made at once."""
    p = policy(switch_evidence=100.0)
    busy_spec = view(with_(SPEC, inflight=6))
    t = warm(p, (EDIT,), busy_spec)
    p.controller.mode.speculating, p.controller.mode.last_flip = False, t
    assert p.decide(CHAT_HOT, busy_spec, t + 0.1).route is Route.BASE


def test_on_a_quiet_pair_a_request_joins_the_running_engine_rather_than_split() -> None:
    """At about one request per request-duration the pair idles every few seconds: a request
    that finds one engine running joins it, whatever suits it alone (a split would make both
    wait for both engines' steps), and one that finds the pair idle takes its own best."""
    p = policy()
    spec_running = view(with_(SPEC, inflight=1))
    t = 0.0
    for _ in range(20):  # 0.5 req/s, the prior 2-s duration: one arrival per request's life
        p.decide(EDIT, view(), t)
        t += 2.0
    joined = p.decide(CHAT_HOT, spec_running, t)
    assert (joined.route, joined.reason) == (Route.SPEC, "join_running")
    alone = p.decide(CHAT_HOT, view(), t + 2.0)
    assert alone.route is Route.BASE and alone.reason in ("idle_pair", "prior")
    # the regime follows the device: the mode is what the pair now runs
    assert p.snapshot()["mode"] == "fallback"


def test_a_pair_that_gets_busy_keeps_the_regime_the_device_is_in() -> None:
    """Leaving the quiet regime, the mode starts from what the device runs, and leaves it
    only on evidence: no drain at the moment the load rises."""
    p = policy()
    t = 0.0
    for _ in range(20):  # quiet, edits: the device runs the spec engine
        p.decide(EDIT, view(), t)
        t += 2.0
    busy = view(with_(SPEC, inflight=8))
    routes = []
    for i in range(40):  # 10 req/s of mixed traffic now
        t = round(t + 0.1, 6)
        routes.append(p.decide(MIXED[i % len(MIXED)], busy, t).route)
    assert routes[0] is Route.SPEC and not p.quiet.quiet


def _outcome(d_route: Route, tpot_s: float, predicted_s: float | None, kind: str = "edit") -> Outcome:
    return Outcome(
        "m", d_route, d_route.value, kind, 0.7, True, completion_tokens=200, tpot_s=tpot_s,
        predicted_tpot_s=predicted_s,
    )  # fmt: skip


def test_measured_latency_corrects_the_model_and_decides() -> None:
    """The model says spec pays for this traffic at this load; the spec engine's requests
    keep measuring 30 % slower than predicted, plain's at the same load as predicted: the
    policy learns that speculation is off and falls back."""
    p = policy()
    mv = view(base=with_(BASE, inflight=0), spec=with_(SPEC, inflight=24))
    t = warm(p, MODERATE, mv)
    d = p.decide(EDIT_WARM, mv, t)
    assert d.route is Route.SPEC and d.predicted_tpot_s is not None
    flipped = None
    for i in range(600):  # 60 s of 10 req/s
        t = round(t + 0.1, 6)
        d = p.decide(MODERATE[i % 2], mv, t)
        if d.route is Route.SPEC and d.predicted_tpot_s is not None:
            p.observe(_outcome(Route.SPEC, 1.3 * d.predicted_tpot_s, d.predicted_tpot_s), t)
            p.estimator.bias.observe(
                Route.BASE, 0.01, 0.01, 200, t, p.estimator.loads.entries[-1][1]
            )  # plain: as modelled
        if d.route is Route.BASE and flipped is None:
            flipped = t
    assert flipped is not None
    state = p.snapshot()
    assert state["mode"] == "fallback"
    factor = state["measured_vs_model"]["spec"]["factor"]  # type: ignore[index]
    assert 1.1 < factor < 1.3  # most of the 30 % gap (shrunk toward the model, then ageing)


def test_a_gap_both_engines_could_share_is_not_held_against_spec() -> None:
    """The same 30 % gap with nothing measured of plain at this load: it may be the device
    or a load the profile prices wrong for any engine (on a saturated peak, plain ran 39 %
    over the model after spec's 19 % had flipped the pair), so it is taken as common and
    the pair stays on spec."""
    p = policy()
    mv = view(base=with_(BASE, inflight=0), spec=with_(SPEC, inflight=24))
    t = warm(p, MODERATE, mv)
    for i in range(600):
        t = round(t + 0.1, 6)
        d = p.decide(MODERATE[i % 2], mv, t)
        assert d.route is Route.SPEC
        if d.predicted_tpot_s is not None:
            p.observe(_outcome(Route.SPEC, 1.3 * d.predicted_tpot_s, d.predicted_tpot_s), t)
    assert (
        p.estimator.bias.log_bias(Route.SPEC, t, p.estimator.loads.entries[-1][1]) > 0.15
    )  # measured, and kept
    assert p.estimator.bias.factor(Route.SPEC, t, p.estimator.loads.entries[-1][1]) == pytest.approx(
        1.0, abs=0.01
    )


def _spec_gap_learned(p: AdaptivePolicy, measured_ratio: float | None) -> tuple[float, float]:
    """30 s of traffic on a busy spec engine whose requests run as the model priced with the
    acceptance measured over their lives (``measured_ratio`` x what was expected; None:
    the live correction's own) would predict: (the log gap each ran beyond its prediction,
    the bias learned)."""
    mv = view(base=with_(BASE, inflight=0), spec=with_(SPEC, inflight=24))
    t = warm(p, MODERATE, mv)
    p.estimator.live.raw_ratio = measured_ratio
    gap = load = 0.0
    for i in range(300):
        t = round(t + 0.1, 6)
        d = p.decide(MODERATE[i % 2], mv, t)
        if d.route is Route.SPEC and d.predicted_tpot_s is not None:
            load, priced = p.estimator.loads.entries[-1][1], p.estimator.loads.entries[-1][2]
            gap = p.estimator.lens(load, 0.5)[0] - priced  # the acceptance was half the expected
            p.observe(_outcome(Route.SPEC, math.exp(gap) * d.predicted_tpot_s, d.predicted_tpot_s), t)
    return gap, p.estimator.bias.log_bias(Route.SPEC, t, load)


def test_a_gap_the_live_acceptance_measured_is_not_learned_twice() -> None:
    """Requests priced before the live acceptance correction had caught up (on an H100 the
    prior's 2.56 tokens a step against 1.6) ran slower than predicted by exactly what the
    acceptance measured over their lives shows: the bias learns nothing from them, or it
    would count the gap again once the correction converged. Without that measurement the
    same gap is the model's, and learned."""
    gap, learned = _spec_gap_learned(policy(), 0.5)
    assert gap > 0.1
    assert learned == pytest.approx(0.0, abs=0.01)
    gap, learned = _spec_gap_learned(policy(), None)
    assert learned > 0.5 * gap


def test_only_clean_measurements_carry_a_prediction() -> None:
    """A request decided while the other engine of the pair is busy shares the device: its
    latency says nothing about the model, so no prediction goes back with it."""
    p = policy()
    quiet = view(with_(SPEC, inflight=2), with_(BASE, inflight=0))
    both = view(with_(SPEC, inflight=2), with_(BASE, inflight=3))
    t = warm(p, (EDIT,), quiet)
    assert p.decide(EDIT, quiet, t).predicted_tpot_s is not None
    assert p.decide(EDIT, both, t + 0.1).predicted_tpot_s is None
    # and an outcome without one leaves the bias alone
    p.observe(_outcome(Route.SPEC, 1.0, None), t + 0.2)
    assert p.snapshot()["measured_vs_model"]["spec"]["samples"] == 0  # type: ignore[index]


def test_requests_the_hard_rules_route_are_this_replicas_own_not_anothers() -> None:
    """A request the hard rules send to plain (min_p) is this replica's: when the next
    scrape still shows it running after it finished, that is not another replica's load,
    and a lone gateway keeps routing a quiet pair request by request."""
    p = policy()
    refused = replace(EDIT, refused_params=("min_p",))
    assert p.decide(refused, view(base=with_(BASE, inflight=0)), 10.0).route is Route.BASE
    # it finished by t=10.5; the scrape taken at t=10.2 still shows it running
    later = view(with_(SPEC, running=0.0, at=10.2), with_(BASE, inflight=0, running=1.0, at=10.2))
    d = p.decide(EDIT, later, 10.5)
    assert not p.cluster.pair.shared(10.5)
    assert d.reason in {Reason.IDLE_PAIR, Reason.PRIOR}  # the pair is idle: the request chooses
    # another replica's request on plain, by contrast, makes the pair shared
    other = view(with_(SPEC, running=0.0, at=11.0), with_(BASE, inflight=0, running=1.0, at=11.0))
    p.decide(EDIT, other, 12.0)
    assert p.cluster.pair.shared(12.0) and p.snapshot()["shared_pair"] is True


@pytest.mark.parametrize("move_on_flip", [True, False])
def test_an_evidence_flip_names_the_engine_to_move_from(move_on_flip: bool) -> None:
    """The decision that flips the regime (and only that one) asks for the old engine's
    streams to move (``move_from``), unless moving is off; a flip that moves hands nothing
    over to the old engine."""
    p = policy(move_on_flip=move_on_flip)
    healthy = view(with_(SPEC, inflight=64, tokens_per_step=2.2))
    collapsed = view(with_(SPEC, inflight=64, tokens_per_step=1.05))
    decisions = []
    t = 0.0
    for mv, until in ((healthy, 20.0), (collapsed, 60.0)):
        while t < until:
            decisions.append(p.decide(EDIT, mv, t))
            t = round(t + 0.1, 6)
    assert p.controller.mode.flips == 1
    moves = [d for d in decisions if d.move_from is not None]
    flip = next(i for i, d in enumerate(decisions) if d.route is Route.BASE or d.probe)
    if move_on_flip:
        assert [d.move_from for d in moves] == [Route.SPEC] and decisions[flip] is moves[0]
        # no handover to the old engine (probes aside)
        assert all(d.route is Route.BASE or d.probe for d in decisions[flip:])
    else:
        assert moves == []


def test_a_replica_in_fallback_follows_the_others_to_spec_unless_it_just_left_it() -> None:
    """On a pair shared with other replicas, the others running spec and nobody else plain
    is a regime this replica joins: a split would make every request wait for both
    engines' steps. A replica that has just left spec on its own evidence holds plain
    instead (the others' grace brings them to plain), so the two never chase each other."""
    p = policy()
    # others' requests on spec only (the scrape shows 3 running, none of them this replica's)
    others_on_spec = view(
        with_(SPEC, inflight=0, running=3.0, at=9.9), with_(BASE, inflight=0, running=0.0, at=9.9)
    )
    p.decide(CHAT_HOT, others_on_spec, 9.0)
    p.controller.mode.speculating = False  # in fallback, since long ago
    d = p.decide(CHAT_HOT, others_on_spec, 10.0)
    assert p.cluster.pair.shared(10.0) and p.controller.mode.speculating
    assert d.route is Route.SPEC and d.move_from is Route.BASE  # its own plain streams move too
    # a replica that left spec a moment ago on its own evidence stays on plain
    q = policy()
    q.decide(CHAT_HOT, others_on_spec, 9.0)
    q.controller.mode.speculating, q.controller.mode.last_flip = False, 9.5
    d = q.decide(CHAT_HOT, others_on_spec, 10.0)
    assert not q.controller.mode.speculating and d.route is Route.BASE
    # and nobody follows into a split: others on both engines leave it where it is
    r = policy()
    split = view(with_(SPEC, inflight=0, running=3.0, at=9.9), with_(BASE, inflight=0, running=2.0, at=9.9))
    r.decide(CHAT_HOT, split, 9.0)
    r.controller.mode.speculating = False
    assert r.decide(CHAT_HOT, split, 10.0).route is Route.BASE and not r.controller.mode.speculating


def test_a_change_of_traffic_flips_within_a_few_of_its_requests() -> None:
    """Copy-heavy edits at T=0 give way to open chat at T=1 on a busy pair: the change of
    traffic ends the mix window, so the mode follows within a few chat requests, where a
    window mean waits until most of the window is chat."""

    def requests_to_fallback(change_z: float) -> int:
        p = policy(mix_change_z=change_z)
        busy = view(with_(SPEC, inflight=6, tokens_per_step=2.5))
        t = warm(p, (EDIT,), busy, interval=0.5)
        assert p.controller.mode.speculating
        for n in range(1, 40):
            if p.decide(CHAT_HOT, busy, t).route is Route.BASE:
                return n
            t = round(t + 0.5, 6)
        return 40

    # the third chat request ends the window; the evidence then takes ~3 s (9 vs 15)
    quick, slow = requests_to_fallback(4.0), requests_to_fallback(0.0)
    assert quick <= 10 and slow - quick >= 5


def test_answers_to_pinned_requests_teach_the_pairs_own_method() -> None:
    """A gateway whose first requests are pinned (an operator's /admin/route, a
    benchmark's static slots) learns from their answers as the pair's method says: an
    EAGLE-3 pair learns its reported acceptance, not the n-gram replay of the answers
    (round 7 on a real H200: learned as n-gram, the pair priced verification at 2.3-3.3 x
    the drafts its engine made and left spec at the peak)."""
    eagle = with_(SPEC, method="eagle3", k=3)
    pinned = replace(view(eagle), pinned=RouteOverride.SPEC)
    p = policy()
    for i in range(50):
        d = p.decide(EDIT, pinned, float(i))
        assert d.reason == Reason.PINNED
        p.observe(
            Outcome(
                "m",
                Route.SPEC,
                "spec",
                "edit",
                0.0,
                ok=True,
                lookup_acceptance=0.95,  # the answer copies the prompt: n-gram would accept
                reported_mean_acceptance_length=1.6,  # what EAGLE-3 accepted
                extra={LOOKUP_DRAFTS_KEY: 0.5},
            ),
            float(i),
        )
    p.decide(EDIT, view(eagle), 50.0)
    snap = p.snapshot()
    assert snap["method"] == "eagle3" and snap["k"] == 3
    assert snap["learned"]["edit/t0"]["tokens_per_step"] == pytest.approx(1.6, abs=0.05)  # type: ignore[index]
    assert snap["mix_verified_tokens_per_step"] == pytest.approx(4.0)  # k + 1 drafts verified
