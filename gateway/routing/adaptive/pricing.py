"""What each regime costs for the traffic now: the pricing half of the adaptive policy
(:class:`~gateway.routing.adaptive.policy.AdaptivePolicy` builds on it).

A request's tokens per speculative step start from the method's prior (n-gram: the
predicted overlap and temperature; model drafters: published curves), blended with what
answers taught per class (:class:`~gateway.routing.acceptance.KindLearner`) and scaled by
the spec engine's live windowed acceptance (:mod:`.live`). The recent traffic (:mod:`.mix`)
is priced with what is known now, and both regimes are costed on one device timeline
(:mod:`.costmodel`) from the profile's step times read at the traffic's context
(:mod:`.context`), scaled per load by the measured step times (:mod:`.stepscale`) and, for
spec, by its measured time per token beyond plain's (:mod:`.calibration`).
"""

from __future__ import annotations

from gateway.physics.methods import NGRAM_METHODS
from gateway.routing.acceptance import KindLearner, ngram_prior, prior_tokens_per_step
from gateway.routing.adaptive.calibration import LatencyBias
from gateway.routing.adaptive.context import ContextTracker
from gateway.routing.adaptive.costmodel import RegimeCosts, regime_costs
from gateway.routing.adaptive.live import LiveCorrections
from gateway.routing.adaptive.mix import MixEntry, MixPrice, TrafficMix
from gateway.routing.config import RoutingConfig
from gateway.routing.overlap import KINDS
from gateway.routing.steptime import StepModel, get_step_model
from gateway.routing.types import RequestFeatures, Route

DEFAULT_K = 5
# Outcome.extra key: draft tokens per step the n-gram replay of the answer realised.
LOOKUP_DRAFTS_KEY = "lookup_draft_tokens_per_step"
_UNKNOWN_DECAY_S = 60.0  # with no live acceptance, the correction relaxes to 1 on this half-life


class RegimePricing:
    """The learned and measured state the regimes are priced from, and the pricing."""

    def __init__(self, cfg: RoutingConfig, steps: StepModel | None) -> None:
        self.cfg = cfg
        # The profile is read at the context the traffic holds (:mod:`.context`), unless a
        # step model is given (it is then taken as it is).
        self.context = ContextTracker(self.cfg.context_tokens)
        self._fixed_steps = steps
        self._steps_at: dict[int, StepModel] = {}
        self.steps = steps or self._steps_for(self.cfg.context_tokens)
        self.learner = KindLearner(KINDS, half_life_s=self.cfg.learn_half_life_s)
        # Per class, learned draft tokens per step (n-gram drafts only on a match).
        self.draft_learner = KindLearner(KINDS, half_life_s=self.cfg.learn_half_life_s)
        self.method = "ngram"  # the spec engine's, as configured (bind)
        self.k = DEFAULT_K
        self._bound = False
        # Recent eligible traffic (what the regimes are priced on).
        self.mix = TrafficMix(self.cfg.mix_window_s, self.cfg.mix_min_requests, self.cfg.mix_change_z)
        self.live = LiveCorrections(
            half_life_s=self.cfg.live_half_life_s,
            unknown_half_life_s=_UNKNOWN_DECAY_S,
            fit_step_times=self.cfg.fit_step_times,
        )
        self.bias = LatencyBias()  # measured ÷ modelled time per token, per engine

    def bind(self, method: str | None, k: int) -> None:
        """The spec engine's method and k (:class:`~gateway.routing.types.PairBound`): what
        an answer teaches depends on them. Bound only at the first request the policy
        routed itself, a gateway whose first requests were pinned (an operator's
        ``/admin/route``, a benchmark's static slots) learned an EAGLE-3 pair's acceptance
        from the n-gram replay of its answers, and the drafts per step with it: it priced
        verification at 2.3-3.3 x the drafts the engine made and left spec at the peak of a
        real H200 day (round 7). Until bound, answers teach nothing."""
        self.method = (method or "ngram").lower()
        self.k = k if k > 0 else DEFAULT_K
        self._bound = True

    def _enter_mix(self, f: RequestFeatures, now: float) -> tuple[str, float, float, float]:
        """A request routed by policy (this replica's or a peer's) joins the traffic the
        regimes are priced on: returns its class, prior tokens per step, prior chance of a
        draft and prior verified tokens per step."""
        kind = f.kind if f.kind in KINDS else "chat"
        prior_e, p_draft = self._prior(f)
        prior_q = 1.0 + p_draft * self.k if self.method in NGRAM_METHODS else float(self.k + 1)
        self.mix.add(MixEntry(now, self.learner.key(kind, f.temperature), prior_e, prior_q))
        return kind, prior_e, p_draft, prior_q

    def _corrected(self, blended: float) -> float:
        return 1.0 + (blended - 1.0) * self.live.ratio

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
        learned: dict[tuple[str, int], tuple[float, float, float, float]] = {}

        def price(m: MixEntry) -> tuple[float, float]:
            c = learned.get(m.klass)
            if c is None:
                c = learned[m.klass] = (
                    *self.learner.learned(m.klass, now),
                    *(self.draft_learner.learned(m.klass, now) if ngram else (0.0, 1.0)),
                )
            w, e, wq, q = c
            return (1.0 - w) * m.prior_tokens_per_step + w * e, (1.0 - wq) * m.prior_verified + wq * q

        return self.mix.priced(price, self.live.ratio, knowledge)

    def _noise(self, costs: RegimeCosts) -> float:
        """The predicted speed-up's sampling error: the mix window holds a few requests of
        a traffic whose acceptance varies request by request, and another window of the same
        traffic would have priced spec this far away."""
        price = self._mix_price()
        if costs.spec_ms <= 0 or price.mean_inverse_tokens_per_step <= 0:
            return 0.0
        decode = costs.spec_ms - costs.shared_ms
        se_ms = decode * price.inverse_se / price.mean_inverse_tokens_per_step
        return self.cfg.noise_z * costs.speedup * se_ms / costs.spec_ms

    def _inv_e_mix(self) -> float:
        return self._mix_price().mean_inverse_tokens_per_step

    def _q_mix(self) -> float:
        """Mean tokens a spec step verifies per sequence for the recent traffic (1 + drafts)."""
        q = self._mix_price().mean_verified
        q = float(self.k + 1) if q is None else q
        return 1.0 + (q - 1.0) * self.live.q_ratio

    def _regime(self, load: float) -> RegimeCosts:
        return regime_costs(
            self.steps,
            load=load,
            q_spec=self._q_mix(),
            inv_tokens_per_step=self._inv_e_mix(),
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
