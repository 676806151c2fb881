"""Live corrections from scraped views: the batch cap an engine shows while it queues."""

from __future__ import annotations

import math

import pytest

from gateway.routing.adaptive import AdaptivePolicy
from gateway.routing.adaptive.live import LiveCorrections
from gateway.routing.config import RoutingConfig
from gateway.routing.steptime import get_step_model
from gateway.routing.types import PairView, Route
from tests.routing.conftest import CHAT_HOT, EDIT, engine, view, with_

SPEC, BASE = engine(Route.SPEC), engine(Route.BASE)


def _refresh(live: LiveCorrections, spec: object, base: object, now: float) -> None:
    live.refresh(PairView(spec, base), now, get_step_model(), 1.5, "ngram", 5)  # type: ignore[arg-type]


def test_the_batch_cap_is_what_an_engine_runs_while_requests_wait() -> None:
    live = LiveCorrections()
    assert math.isinf(live.batch_cap) and live.batch(5000) == 5000
    # a short queue beside a small batch is the prefill budget at work, not the cap
    _refresh(live, SPEC, with_(BASE, running=12.0, waiting=3.0), 0.0)
    assert math.isinf(live.batch_cap)
    # so is a burst of admissions beside a moderate batch (the engine is not full)
    _refresh(live, with_(SPEC, running=54.0, waiting=2.0), BASE, 0.5)
    assert math.isinf(live.batch_cap)
    _refresh(live, SPEC, with_(BASE, running=256.0, waiting=900.0), 1.0)
    _refresh(live, SPEC, with_(BASE, running=200.0, waiting=0.0), 2.0)  # no queue: no evidence
    assert live.batch_cap == 256.0
    assert live.batch(1500) == 256.0 and live.batch(80) == 80


def test_a_kv_bound_cap_is_what_the_engine_typically_runs_not_its_peak() -> None:
    """An engine bound by its KV cache runs 110-150 requests while the rest wait: the cap
    follows the typical batch (pricing at its peak would make every step too dear)."""
    live = LiveCorrections()
    for i in range(120):
        running = (110.0, 150.0, 130.0, 140.0, 120.0)[i % 5]
        _refresh(live, SPEC, with_(BASE, running=running, waiting=900.0), float(i))
    assert 120.0 < live.batch_cap < 140.0
    # running more than that without a queue proves the cap higher
    _refresh(live, SPEC, with_(BASE, running=200.0, waiting=0.0), 121.0)
    assert live.batch_cap == 200.0


def test_a_saturated_pair_is_priced_at_the_cap_not_at_its_queue() -> None:
    """At 1,500 requests in flight the profile must not be read at a batch of 1,500: the
    engines run 256 and queue the rest (a saturated sweep point went to spec on that)."""
    p = AdaptivePolicy(RoutingConfig(policy="adaptive"))
    saturated = view(base=with_(BASE, inflight=1500, running=256.0, waiting=1244.0))
    p.decide(EDIT, saturated, 0.0)
    d = p.decide(EDIT, saturated, 0.1)
    costs = p.estimator.last_costs
    assert costs is not None
    assert costs.base_ms == p.estimator.steps.step_ms(256.0, 1.0) * p.estimator.live.scale_base
    assert d.route is Route.SPEC  # copy-heavy T=0 edits still pay on spec at the cap
    # open chat goes to the queueing plain engine (spec idle); the prediction that goes back
    # with it, for the measured time per token to be held against, is the full batch's: its
    # time per token starts at its first token, when it runs in the engine's capped batch
    chats = AdaptivePolicy(RoutingConfig(policy="adaptive"))
    chats.decide(CHAT_HOT, saturated, 0.0)
    chat = chats.decide(CHAT_HOT, saturated, 0.1)
    assert chat.route is Route.BASE and chats.estimator.last_costs is not None
    assert chat.predicted_tpot_s == pytest.approx(chats.estimator.last_costs.base_ms / 1000.0)
    assert (
        chats.estimator.last_costs.base_ms
        >= chats.estimator.steps.step_ms(256.0, 1.0) * chats.estimator.live.scale_base
    )


def _fit_base(preemptions_per_s: float | None, context_tokens: float) -> float:
    """scale_base after a minute of a plain engine alone at batch 64 whose steps take twice
    the profile's decode time, half of it prefilling preempted requests' contexts again."""
    steps = get_step_model()
    decode_ms = steps.step_ms(64.0, 1.0)
    live = LiveCorrections()
    for i in range(60):
        base = with_(
            BASE,
            inflight=64,
            running=64.0,
            step_s=2 * decode_ms / 1000 + i * 1e-9,  # a new scrape each second
            prefill_tps=0.0,
            preemptions_per_s=preemptions_per_s,
        )
        live.refresh(PairView(SPEC, base), float(i), steps, 1.5, "ngram", 5, context_tokens=context_tokens)
    return live.scale_base


def test_recompute_after_preemption_is_prefill_not_slow_decoding() -> None:
    """A full KV cache preempts, and each preempted request prefills its whole context
    again; vLLM's prompt counter does not count it. Taken for decoding, it read as a
    saturated engine's steps being 20 % slower than they were."""
    c = get_step_model().prefill_ms_per_token()
    ctx = 500.0
    per_s = 0.5 / (c / 1000.0) / ctx  # preemptions that fill half the engine's time
    assert _fit_base(per_s, ctx) == pytest.approx(1.0, abs=0.05)
    assert _fit_base(None, ctx) > 1.8  # unknown: all of it reads as decoding


@pytest.mark.parametrize(("scrape_s", "earliest", "latest"), [(1.0, 10.0, 11.0), (2.0, 11.0, 12.5)])
def test_an_engine_alone_for_part_of_a_window_is_fitted_on_its_recent_part(
    scrape_s: float, earliest: float, latest: float
) -> None:
    """After a flip the new engine runs alone, but the scrape window still holds the old
    engine's steps: its recent part is fitted as soon as it lies wholly after the flip,
    instead of a whole window later (a saturated peak spent 15 s on the assumed engine).
    The scraped running count that shows the other engine stopped is up to a scrape
    interval late, so the recent part must also start that long after."""
    from gateway.routing.types import EngineStats

    steps = get_step_model()
    decode_ms = steps.step_ms(64.0, 1.0)
    live = LiveCorrections()
    first_fit = None
    for i in range(40):
        t = i * 0.5
        at = 1.0 + scrape_s * math.floor(t / scrape_s)  # the newest scrape's time
        flipped = t >= 6.0
        spec = with_(SPEC, running=0.0 if flipped else 64.0, step_s=0.02 + at * 1e-9, prefill_tps=0.0, at=at)
        recent = EngineStats(
            window_s=3.0, step_s=2 * decode_ms / 1000, generation_tps=5000.0, prefill_tps=0.0
        )
        base = with_(
            BASE,
            running=64.0 if flipped else 0.0,
            # the whole window holds both engines' steps until it is all after the flip
            step_s=(5 if t < 16.0 else 2) * decode_ms / 1000 + at * 1e-9,
            prefill_tps=0.0,
            recent=recent if flipped else None,
            at=at,
        )
        live.refresh(PairView(spec, base), t, steps, 1.5, "ngram", 5)
        if first_fit is None and live.scales.fits[False]:
            first_fit = t
    assert first_fit is not None
    # alone from 6 s: the 3-s recent part is its own, a scrape interval later
    assert earliest <= first_fit <= latest
    # read at the batch it ran: twice the profile (the whole window's 5 x never counted
    # while it held the other engine's steps)
    assert live.scale(False, 64.0) == pytest.approx(2.0, rel=0.15)


def test_no_recent_part_no_early_fit() -> None:
    steps = get_step_model()
    live = LiveCorrections()
    for i in range(20):
        t = i * 0.5
        flipped = t >= 2.0
        spec = with_(SPEC, running=0.0 if flipped else 64.0, step_s=0.02 + i * 1e-9)
        base = with_(BASE, running=64.0 if flipped else 0.0, step_s=0.03 + i * 1e-9, prefill_tps=0.0)
        live.refresh(PairView(spec, base), t, steps, 1.5, "ngram", 5)
    assert live.scales.fits[False] == 0  # alone 7.5 s of a 10-s window, and nothing recent
