"""Explorations (:mod:`gateway.routing.adaptive.explore`): an engine whose step time at the
pair's load is only assumed is run there once, bounded in time and rate."""

from __future__ import annotations

from gateway.routing.adaptive import AdaptivePolicy
from gateway.routing.adaptive.explore import ExploreKnobs, Explorer
from gateway.routing.adaptive.stepscale import StepScales
from gateway.routing.config import RoutingConfig
from gateway.routing.types import Decision, ModelView, Reason, RequestFeatures, Route
from tests.routing.conftest import CHAT_HOT, SUMMARY, engine, view, with_

RETRY_S, SPEC_MAX_S = ExploreKnobs().retry_s, ExploreKnobs().spec_max_s
SPEC, BASE = engine(Route.SPEC), engine(Route.BASE)
EDIT_WARM = RequestFeatures("m", temperature=0.7, overlap=0.85, kind="edit")
MODERATE = (EDIT_WARM, SUMMARY)  # accepts enough that step times decide


def scales_with(
    spec_loads: tuple[float, ...],
    plain_loads: tuple[float, ...],
    now: float,
    spec_ratio: float = 0.8,
    plain_ratio: float = 1.0,
) -> StepScales:
    """Step fits at those loads: spec ``spec_ratio`` x the profile (by default cheaper),
    plain ``plain_ratio`` x."""
    s = StepScales()
    for load in spec_loads:
        s.observe(True, load, spec_ratio, now)
    for load in plain_loads:
        s.observe(False, load, plain_ratio, now)
    return s


def ask(x: Explorer, s: StepScales, now: float, load: float = 32.0, **kw: object) -> bool:
    """Explorer.spec for a pair in fallback (by default: traffic that could pay, and a
    prediction 5 % short of what spec must show)."""
    args: dict[str, object] = {"speculating": False, "could_pay": True, "headroom": 0.05} | kw
    return x.spec(s, now, load=load, **args)  # type: ignore[arg-type]


def test_spec_is_explored_where_only_plain_ran_until_measured_there() -> None:
    s = scales_with((4.0,), (32.0,), 0.0)
    x = Explorer()
    assert ask(x, s, 1.0)
    assert ask(x, s, 2.0, speculating=True)  # under way: still unmeasured here
    s.observe(True, 32.0, 0.8, 3.0)
    assert not ask(x, s, 3.5, speculating=True)  # measured: over, the evidence decides


def test_a_spec_exploration_ends_after_its_bound_and_waits_per_load_octave() -> None:
    s = scales_with((4.0,), (32.0, 64.0), 0.0)
    x = Explorer()
    assert ask(x, s, 0.0)
    assert ask(x, s, SPEC_MAX_S - 0.1, speculating=True)
    # nothing measured by the bound: over, and not again in this octave for a while
    assert not ask(x, s, SPEC_MAX_S)
    assert not ask(x, s, RETRY_S - 1.0, load=40.0)
    # another octave is another question
    assert ask(x, s, SPEC_MAX_S + 1.0, load=64.0)
    s2 = scales_with((4.0,), (32.0,), RETRY_S)  # plain measured again, spec still not
    assert ask(x, s2, RETRY_S + 1.0)


def test_spec_is_not_explored_where_it_could_not_pay_or_already_runs_or_was_measured() -> None:
    s = scales_with((4.0,), (32.0,), 0.0)
    assert not ask(Explorer(), s, 1.0, could_pay=False)
    assert not ask(Explorer(), s, 1.0, speculating=True)
    # spec measured near this load (within an octave), or plain not measured here
    assert not ask(Explorer(), scales_with((24.0,), (32.0,), 0.0), 1.0)
    assert not ask(Explorer(), scales_with((4.0,), (4.0,), 0.0), 1.0)


def test_a_spec_engine_as_cheap_or_dearer_than_the_profile_where_it_ran_is_trusted_where_it_did_not() -> None:
    """Measured dearer than the profile where it ran, spec is taken as dearer at a larger
    batch too, and the extrapolation flatters it (not explored); measured cheaper, a
    prediction that misses paying by up to that cheapness (beyond the fits' noise) is
    explored, and one that misses by more is not: the cheapness is not doubled."""
    cheaper = scales_with((4.0,), (32.0,), 0.0, spec_ratio=0.8)  # log 1.25 = 0.22 cheaper
    assert ask(Explorer(), cheaper, 1.0, headroom=0.15)  # within 0.22 - log 1.05 = 0.17
    assert not ask(Explorer(), cheaper, 1.0, headroom=0.20)
    assert not ask(Explorer(), cheaper, 1.0, headroom=0.30)
    for ratio in (1.0, 0.97, 1.5):  # on the profile (within its noise), or dearer
        assert not ask(Explorer(), scales_with((4.0,), (32.0,), 0.0, spec_ratio=ratio), 1.0, headroom=0.01)


def test_spec_predicted_to_pay_is_left_to_the_evidence() -> None:
    assert not ask(Explorer(), scales_with((4.0,), (32.0,), 0.0), 1.0, headroom=0.0)
    assert not ask(Explorer(), scales_with((), (32.0,), 0.0, plain_ratio=1.4), 1.0, headroom=-0.1)


def test_an_engine_never_measured_is_not_explored() -> None:
    """Nothing to extrapolate from: exploring it where plain first read off the profile
    (a saturated peak) cost a simulated 48-QPS day 14 %."""
    for plain in (1.0, 1.4):
        never = scales_with((), (32.0,), 0.0, plain_ratio=plain)
        assert never.cheaper(True, 0.0) is None
        assert not ask(Explorer(), never, 1.0, headroom=0.01)


def _closed_loop(
    p: AdaptivePolicy,
    traffic: tuple[RequestFeatures, ...],
    factors: dict[Route, float],
    load: float,
    t0: float,
    seconds: int,
) -> list[Decision]:
    """``seconds`` of traffic, 10 requests a second; each second the engine the pair's last
    request went to runs ``load`` - 1 requests alone, with steps ``factors[route]`` x the
    profile's (a new scrape every second): the device runs what the policy routes."""
    out: list[Decision] = []
    running = Route.BASE
    n = int(load) - 1
    for i in range(seconds):
        if running is Route.SPEC:
            ms = p.estimator.steps.step_ms(load, p.estimator.q_mix()) + p.estimator.steps.spec_extra_ms(
                "ngram", p.estimator.k, load
            )
            step_s = factors[Route.SPEC] * ms / 1000 + i * 1e-9
            mv = view(with_(SPEC, inflight=n, step_s=step_s), with_(BASE, inflight=0))
        else:
            step_s = factors[Route.BASE] * p.estimator.steps.step_ms(load, 1.0) / 1000 + i * 1e-9
            mv = view(with_(SPEC, inflight=0), with_(BASE, inflight=n, step_s=step_s))
        for j in range(10):
            out.append(p.decide(traffic[j % len(traffic)], mv, t0 + i + j / 10))
        running = out[-1].route
    return out


def _pair_in_fallback_at_peak(traffic: tuple[RequestFeatures, ...]) -> tuple[AdaptivePolicy, float]:
    """Both engines measured at a batch of 9: spec's steps 1.6 x the profile's (a dear
    drafter), plain's as the profile. The pair is then at a batch of 64 on plain, where
    spec never ran."""
    p = AdaptivePolicy(RoutingConfig(policy="adaptive"))
    _closed_loop(p, traffic, {Route.SPEC: 1.6, Route.BASE: 1.0}, 9.0, 0.0, 20)
    return p, 20.0


def _explorations(decisions: list[Decision]) -> int:
    starts = 0
    for a, b in zip([None, *decisions], decisions, strict=False):
        if b.reason == Reason.EXPLORE and (a is None or a.reason != Reason.EXPLORE):
            starts += 1
    return starts


def _settled(traffic: tuple[RequestFeatures, ...], busy: ModelView) -> tuple[AdaptivePolicy, float]:
    """A policy after 30 s of ``traffic`` on ``busy``: the traffic's mix and the mode settle."""
    p = AdaptivePolicy(RoutingConfig(policy="adaptive"))
    t = 0.0
    for i in range(300):
        p.decide(traffic[i % len(traffic)], busy, t)
        t += 0.1
    return p, t


def _ending_an_exploration(traffic: tuple[RequestFeatures, ...]) -> tuple[AdaptivePolicy, Decision]:
    """A busy pair (8 requests on spec) whose exploration of spec has just run out: the
    next request ends it."""
    busy = view(with_(SPEC, inflight=8), with_(BASE, inflight=0))
    p, t = _settled(traffic, busy)
    p.controller.mode.follow(True)  # the exploration's regime
    p.controller.explorer.spec_on, p.controller.explorer.spec_until = True, t - 1.0
    return p, p.decide(traffic[0], busy, t)


def test_an_exploration_measures_and_goes_back_to_plain_unless_spec_pays_beyond_the_band() -> None:
    """An exploration must not flip a pair whose prediction sits inside the band (the band
    would then hold whichever regime ran: a 120-s stationary run at 32 QPS stayed on the
    explored spec engine, 8 % slower): it ends on plain unless spec now pays."""
    p, d = _ending_an_exploration((CHAT_HOT, SUMMARY))  # spec does not pay
    assert d.route is Route.BASE and not p.controller.mode.speculating
    assert d.move_from is Route.SPEC  # the explored engine's streams come back
    p, d = _ending_an_exploration((EDIT_WARM,))  # spec pays beyond the band: kept
    assert d.route is Route.SPEC and p.controller.mode.speculating


def test_a_spec_engine_dearer_than_the_profile_where_it_ran_is_not_explored_at_the_peak() -> None:
    p, t = _pair_in_fallback_at_peak(MODERATE)
    decisions = _closed_loop(p, MODERATE, {Route.SPEC: 1.6, Route.BASE: 1.0}, 64.0, t, 60)
    assert _explorations(decisions) == 0
    assert not p.controller.mode.speculating and decisions[-1].route is Route.BASE


def test_traffic_that_could_not_pay_for_speculation_never_explores_spec() -> None:
    p, t = _pair_in_fallback_at_peak((CHAT_HOT,))
    decisions = _closed_loop(p, (CHAT_HOT,), {Route.SPEC: 0.7, Route.BASE: 1.0}, 64.0, t, 60)
    assert not any(d.route is Route.SPEC for d in decisions)


def test_plain_is_explored_once_while_only_assumed_and_the_end_is_reported() -> None:
    """Spec's fits settled far off the profile and plain never ran: plain is explored until
    measured, and the call that ends it says so once."""
    s = scales_with((4.0, 4.0, 4.0), (), 0.0, spec_ratio=1.3)
    x = Explorer()
    assert not x.plain(s, 0.0, speculating=True, queued=True, scale_spec=1.3)  # never beside a queue
    assert not x.plain(s, 0.0, speculating=True, queued=False, scale_spec=1.1)  # near the profile
    assert x.plain(s, 0.0, speculating=True, queued=False, scale_spec=1.3)
    assert x.plain(s, 1.0, speculating=False, queued=False, scale_spec=1.3) and not x.plain_ended
    s.observe(False, 4.0, 1.3, 2.0)  # plain measured: over
    assert not x.plain(s, 2.5, speculating=False, queued=False, scale_spec=1.3) and x.plain_ended
    assert not x.plain(s, 3.0, speculating=True, queued=False, scale_spec=1.3) and not x.plain_ended


def _ending_a_plain_exploration(traffic: tuple[RequestFeatures, ...]) -> tuple[AdaptivePolicy, Decision]:
    """A busy pair (8 requests on plain) whose exploration of plain has just measured it:
    the next request ends it."""
    busy = view(with_(SPEC, inflight=0), with_(BASE, inflight=8))
    p, t = _settled(traffic, busy)
    p.controller.mode.follow(False)  # the exploration's regime
    p.controller.explorer.plain_on, p.controller.explorer.plain_until = True, t + 10.0
    p.estimator.live.scales.observe(True, 9.0, 1.3, t)
    p.estimator.live.scales.observe(False, 9.0, 1.3, t)  # plain measured
    return p, p.decide(traffic[0], busy, t)


def test_a_plain_exploration_measures_and_goes_back_to_spec_unless_plain_pays_beyond_the_band() -> None:
    """The pair was speculating when plain was explored: on a real H100 the fallback the
    exploration left behind held a pair on plain for 20-30 s at light load where spec was
    20 % faster. It ends on spec unless plain now pays beyond the band."""
    p, d = _ending_a_plain_exploration((EDIT_WARM,))  # spec pays
    assert d.route is Route.SPEC and p.controller.mode.speculating
    assert not p.controller.explorer.plain_ended
    p, d = _ending_a_plain_exploration((CHAT_HOT, SUMMARY))  # spec does not pay: plain kept
    assert d.route is Route.BASE and not p.controller.mode.speculating
