"""Estimate: what each regime costs for the traffic now, at the load a request finds.

Step 1 of the policy's pipeline (:mod:`.policy`). A request's tokens per speculative step
start from the method's prior (n-gram: the predicted overlap and temperature; model
drafters: published curves), blended with what answers taught per class
(:class:`~gateway.routing.acceptance.KindLearner`) and scaled by the spec engine's live
windowed acceptance (:mod:`.live`). The recent traffic (:mod:`.mix`) is priced with what
is known now, and both regimes are costed on one device timeline (:mod:`.costmodel`)
from the physics prior (the profile's step times at the traffic's context,
:mod:`.context`), corrected by what the gateway measured: step times per engine and load
(:mod:`.stepscale`) and, for spec, its measured time per token beyond plain's
(:mod:`.calibration`). A finished request teaches the learners and the latency bias; the
bias only when the load held while it ran (:mod:`.loadlog`), so a measurement taken
through a move or a drain is not mistaken for the engine's price.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.physics.methods import NGRAM_METHODS
from gateway.routing.acceptance import KindLearner, ngram_prior, prior_tokens_per_step
from gateway.routing.adaptive.calibration import LatencyBias
from gateway.routing.adaptive.context import ContextTracker
from gateway.routing.adaptive.costmodel import RegimeCosts, regime_costs
from gateway.routing.adaptive.knobs import MS_PER_S, knob
from gateway.routing.adaptive.live import LiveCorrections, LiveKnobs
from gateway.routing.adaptive.loadlog import LoadLog
from gateway.routing.adaptive.mix import MixEntry, MixPrice, TrafficMix
from gateway.routing.config import RoutingConfig
from gateway.routing.overlap import KINDS
from gateway.routing.steptime import StepModel, get_step_model
from gateway.routing.types import Outcome, PairView, RequestFeatures, Route

DEFAULT_K = 5
# Outcome.extra key: draft tokens per step the n-gram replay of the answer realised.
LOOKUP_DRAFTS_KEY = "lookup_draft_tokens_per_step"


@dataclass(frozen=True, slots=True)
class EstimateKnobs:
    duration_s: float = knob(2.0, "s", "a request's duration before any answer: a short chat answer")
    duration_smoothing: float = knob(
        0.05, "weight per answer", "the mean request duration follows about the last 20 answers"
    )
    min_inverse_e: float = knob(1e-6, "1/tokens", "guards a division where the mix is empty")
    min_live_ratio: float = knob(
        0.05, "x expected acceptance", "the live acceptance ratio's floor (as the live correction clips it)"
    )
    full_acceptance_ratio: float = knob(
        0.95,
        "x expected acceptance",
        "within 5 % of the expected acceptance, acceptance is not what holds spec back",
    )


@dataclass(frozen=True, slots=True)
class RequestEstimate:
    """What the estimator predicts for one request."""

    kind: str
    prior_e: float  # tokens per spec step, as its prior predicts
    p_draft: float  # chance a spec step drafts at all (n-gram: a match)
    blended: float  # E, prior blended with its class's learned value
    evidence: float  # how much of ``blended`` is learned (0: the prior alone)
    e: float  # ``blended`` corrected by the live acceptance
    q: float  # tokens a spec step verifies for it


class Estimator:
    """Per engine of the pair, the predicted time per token at the load a request finds."""

    def __init__(
        self, cfg: RoutingConfig, steps: StepModel | None, knobs: EstimateKnobs | None = None
    ) -> None:
        self.cfg = cfg
        self.knobs = knobs or EstimateKnobs()
        # The profile is read at the context the traffic holds (:mod:`.context`), unless a
        # step model is given (it is then taken as it is).
        self.context = ContextTracker(cfg.context_tokens)
        self._fixed_steps = steps
        self._steps_at: dict[int, StepModel] = {}
        self.steps = steps or self._steps_for(cfg.context_tokens)
        self.learner = KindLearner(KINDS, half_life_s=cfg.learn_half_life_s)
        # Per class, learned draft tokens per step (n-gram drafts only on a match).
        self.draft_learner = KindLearner(KINDS, half_life_s=cfg.learn_half_life_s)
        self.method = "ngram"  # the spec engine's, as configured (bind)
        self.k = DEFAULT_K
        self.bound = False
        self.mix = TrafficMix(cfg.mix_window_s, cfg.mix_min_requests, cfg.mix_change_z)
        self.live = LiveCorrections(
            half_life_s=cfg.live_half_life_s, fit_step_times=cfg.fit_step_times, knobs=LiveKnobs()
        )
        self.bias = LatencyBias()  # measured ÷ modelled time per token, per engine
        self.loads = LoadLog()
        self.last_costs: RegimeCosts | None = None
        self.duration_s = self.knobs.duration_s  # mean request duration
        self.decode_s = self.knobs.duration_s  # its decoding part (first token to last)

    def bind(self, method: str | None, k: int) -> None:
        """The spec engine's method and k (:class:`~gateway.routing.types.PairBound`): what
        an answer teaches depends on them, so answers teach nothing until bound (a gateway
        whose first requests were pinned would otherwise learn an EAGLE-3 pair's acceptance
        from the n-gram replay of its answers)."""
        self.method = (method or "ngram").lower()
        self.k = k if k > 0 else DEFAULT_K
        self.bound = True

    # -- per request --------------------------------------------------------------------
    def refresh(self, pair: PairView, now: float, *, shared: bool) -> None:
        """Fold the engines' latest scrapes in (once per decision). A change point needs the
        whole traffic: a replica on a shared pair sees a share of it, and a cut on a few of
        its own requests would take it away from the others' regime."""
        self.mix.change_z = 0.0 if shared else self.cfg.mix_change_z
        self.live.refresh(
            pair, now, self.steps, self.q_mix(), self.method, self.k, self.duration_s, self.context.mean()
        )

    def enter(self, f: RequestFeatures, now: float) -> tuple[str, float, float, float]:
        """A request routed by policy (this replica's or a peer's) joins the traffic the
        regimes are priced on: returns its class, prior tokens per step, prior chance of a
        draft and prior verified tokens per step."""
        kind = f.kind if f.kind in KINDS else "chat"
        prior_e, p_draft = self._prior(f)
        prior_q = 1.0 + p_draft * self.k if self.method in NGRAM_METHODS else float(self.k + 1)
        self.mix.add(MixEntry(now, self.learner.key(kind, f.temperature), prior_e, prior_q))
        return kind, prior_e, p_draft, prior_q

    def request(self, f: RequestFeatures, now: float) -> RequestEstimate:
        """:meth:`enter`, then the request's own tokens per step (:meth:`blend`)."""
        return self.blend(f, self.enter(f, now), now)

    def blend(
        self, f: RequestFeatures, entered: tuple[str, float, float, float], now: float
    ) -> RequestEstimate:
        """A request's tokens per step: its prior blended with what its class taught,
        live-corrected, and the tokens a spec step verifies for it."""
        kind, prior_e, p_draft, prior_q = entered
        blended, evidence = self.learner.blend(kind, f.temperature, prior_e, now)
        e = 1.0 + (blended - 1.0) * self.live.ratio
        q, _ = self.draft_learner.blend(kind, f.temperature, prior_q, now)
        return RequestEstimate(kind, prior_e, p_draft, blended, evidence, e, q)

    def price_at(self, spec_load: float, base_load: float, now: float) -> tuple[RegimeCosts, float]:
        """Both regimes priced at the load a request found (its batch: the pair's load and
        the request); the load is logged for the bias's filter."""
        load = self.live.batch(spec_load + base_load + 1.0)
        self.live.last_load = load
        self.loads.record(now, load, self.lens(load))
        costs = self.last_costs = self.regime(load)
        return costs, load

    def own(self, costs: RegimeCosts, e: float) -> tuple[float, float]:
        """(this request's predicted speed-up on spec, its decoding ms per token there)."""
        decode_ms = (costs.spec_ms - costs.shared_ms) / self.inv_e_mix() / e
        own_spec_ms = decode_ms + costs.shared_ms
        return (costs.base_ms / own_spec_ms if own_spec_ms > 0 else 1.0), decode_ms

    def predicted_tpot_s(
        self, route: Route, costs: RegimeCosts, decode_ms: float, load: float, now: float
    ) -> float:
        """What the model alone predicts for the request on ``route`` (the bias learns from
        it). One that queues counts: its time per token starts at its first token, in the
        engine's full batch, which the model prices at the cap."""
        ms = costs.base_ms
        if route is Route.SPEC:  # the model's own prediction, without spec's measured bias
            ms = decode_ms / self.bias.factor(Route.SPEC, now, load) + costs.shared_ms
        return ms / MS_PER_S

    def unloaded_speedup(self) -> float:
        """Spec's predicted speed-up for a request alone on the pair."""
        return self.regime(1.0).speedup

    def speedup_at_full_acceptance(self, load: float) -> float | None:
        """Spec's predicted speed-up at ``load`` were its acceptance what was expected
        (None: it is about that already, so recovering it changes nothing)."""
        if self.live.ratio >= self.knobs.full_acceptance_ratio:
            return None
        saved = self.live.ratio
        self.live.ratio = 1.0
        try:
            return self.regime(load).speedup
        finally:
            self.live.ratio = saved

    def noise(self, costs: RegimeCosts) -> float:
        """The predicted speed-up's sampling error: the mix window holds a few requests of
        a traffic whose acceptance varies request by request, and another window of the same
        traffic would have priced spec this far away."""
        price = self._mix_price()
        if costs.spec_ms <= 0 or price.mean_inverse_tokens_per_step <= 0:
            return 0.0
        decode = costs.spec_ms - costs.shared_ms
        se_ms = decode * price.inverse_se / price.mean_inverse_tokens_per_step
        return self.cfg.noise_z * costs.speedup * se_ms / costs.spec_ms

    def drain_s(self) -> float:
        """How long a flip's drain lasts: the old engine's requests run to their end, queue
        included, unless the flip moves them (``move_on_flip``); then the queued ones are
        re-sent at once and what is left is about one request's decoding. Evidence scaled
        by a saturated pair's whole request lives (minutes of queue) would hold a flip back
        for as long."""
        return self.decode_s if self.cfg.move_on_flip else self.duration_s

    # -- pricing ------------------------------------------------------------------------
    def _prior(self, f: RequestFeatures) -> tuple[float, float]:
        override = self.cfg.prior_tokens_per_step.get(self.method)
        if self.method in NGRAM_METHODS:
            e, p = ngram_prior(f.overlap, f.temperature, self.k)
            return (override if override is not None else e), p
        if override is not None:
            return override, 1.0
        return prior_tokens_per_step(self.method, f.overlap, f.temperature, self.k), 1.0

    def _mix_price(self) -> MixPrice:
        """The recent traffic priced with what is known now (:mod:`.mix`): per class, the
        learned E and verified tokens blended with each request's prior."""
        ngram = self.method in NGRAM_METHODS
        knowledge = (self.learner.version, self.draft_learner.version, ngram)
        hit = self.mix.cached(self.live.ratio, knowledge)
        if hit is not None:  # most calls of a decision: priced already
            return hit
        now = self.live.last_update
        learner, drafts = self.learner, self.draft_learner

        def learned(klass: tuple[str, int]) -> tuple[float, float, float, float]:
            return (*learner.learned(klass, now), *(drafts.learned(klass, now) if ngram else (0.0, 1.0)))

        return self.mix.priced_by_class(learned, self.live.ratio, knowledge)

    def inv_e_mix(self) -> float:
        """Mean 1/E of the recent traffic (live-corrected)."""
        return self._mix_price().mean_inverse_tokens_per_step

    def q_mix(self) -> float:
        """Mean tokens a spec step verifies per sequence for the recent traffic (1 + drafts)."""
        q = self._mix_price().mean_verified
        q = float(self.k + 1) if q is None else q
        return 1.0 + (q - 1.0) * self.live.q_ratio

    def regime(self, load: float) -> RegimeCosts:
        """Both regimes' time per token at ``load``: the prior, corrected by measurement."""
        return regime_costs(
            self.steps,
            load=load,
            q_spec=self.q_mix(),
            inv_tokens_per_step=self.inv_e_mix(),
            scale_spec=self.live.scale(True, load)
            * self.bias.factor(Route.SPEC, self.live.last_update, load),
            scale_base=self.live.scale(False, load),
            margin=self.cfg.margin,
            method=self.method,
            k=self.k,
            prefill_per_token=self.live.prefill_per_token,
        )

    def _steps_for(self, ctx: int) -> StepModel:
        model = self._steps_at.get(ctx)
        if model is None:
            model = self._steps_at[ctx] = get_step_model(self.cfg.profile, ctx)
        return model

    # -- learning -----------------------------------------------------------------------
    def lens(self, load: float, ratio: float | None = None) -> tuple[float, float]:
        """The log of the live corrections the model applies at ``load`` to spec (its step
        scale, and the acceptance correction: the mix's tokens per step as the prior and the
        learned classes expect ÷ as corrected by the live ratio, or by ``ratio`` when given)
        and to plain (its step scale); see :mod:`.calibration`."""
        floor = self.knobs.min_live_ratio
        e = 1.0 / max(self.inv_e_mix(), self.knobs.min_inverse_e)
        expected = 1.0 + (e - 1.0) / max(self.live.ratio, floor)
        if ratio is not None:
            e = 1.0 + (expected - 1.0) * max(ratio, floor)
        return (
            math.log(self.live.scale(True, load) * expected / e),
            math.log(self.live.scale(False, load)),
        )

    def _repriced(self, outcome: Outcome, now: float) -> tuple[float, float] | None:
        """The load the request found (if it held, :class:`.loadlog.LoadLog`) and the log of
        the live corrections its prediction was priced with ÷ those measured over its life
        (the latest window's acceptance, its engine's step time now): what the latency bias
        must not count (:mod:`.calibration`)."""
        held = self.loads.held(outcome, now, self.lens)
        if held is None:
            return None
        found, priced = held
        measured = self.lens(found, self.live.raw_ratio)[0 if outcome.route is Route.SPEC else 1]
        return found, priced - measured

    def observe(self, outcome: Outcome, now: float) -> None:
        """Learn from a finished request: the context, the latency bias, the request
        duration, and (once the pair's method is bound) the acceptance per class."""
        if not outcome.ok:
            return
        self.context.observe(outcome.prompt_tokens, outcome.completion_tokens)
        if self._fixed_steps is None:
            self.steps = self._steps_for(self.context.bucket())
        held = self._repriced(outcome, now)
        if outcome.predicted_tpot_s is not None and outcome.tpot_s is not None and held is not None:
            found, repriced = held
            tokens = outcome.completion_tokens
            self.bias.observe(
                outcome.route, outcome.tpot_s, outcome.predicted_tpot_s, tokens, now, found, repriced
            )
        if outcome.ttft_s is not None and outcome.tpot_s is not None and outcome.completion_tokens > 0:
            decode = outcome.tpot_s * max(0, outcome.completion_tokens - 1)
            a = self.knobs.duration_smoothing
            self.duration_s += a * (outcome.ttft_s + decode - self.duration_s)
            self.decode_s += a * (decode - self.decode_s)
        kind = outcome.kind if outcome.kind in KINDS else "chat"
        if not self.bound:
            return  # the pair's method is not known yet: nothing to attribute the answer to
        if self.method in NGRAM_METHODS:
            if outcome.lookup_acceptance is not None:
                self.learner.observe(kind, outcome.temperature, outcome.lookup_acceptance * self.k, now)
            drafted = outcome.extra.get(LOOKUP_DRAFTS_KEY)
            if drafted is not None:
                self.draft_learner.observe(kind, outcome.temperature, drafted, now)
        elif outcome.reported_mean_acceptance_length is not None:
            self.learner.observe(
                kind, outcome.temperature, outcome.reported_mean_acceptance_length - 1.0, now
            )
