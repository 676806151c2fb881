"""The adaptive policy: the pure decision core (no I/O; state in, decision out).

Per request, after the hard rules (:func:`gateway.routing.rules.apply_hard_rules`):

1. predicted tokens per speculative step ``E`` for this request: the method prior
   (n-gram: from the predicted overlap and temperature; model drafters: published
   curves decaying with temperature), blended with what was learned for its class
   (:class:`~gateway.routing.acceptance.KindLearner`), scaled by the ratio of the spec
   engine's live windowed acceptance to what the router expected of the traffic it sent;
2. step times of both engines at their current load from the calibration profile,
   scaled by the ratio of their measured per-token latency to the predicted one;
3. both engines on one device timeline, plus the delay the request imposes on the
   others (:mod:`gateway.routing.costmodel`) → predicted speed-up of spec over base;
4. the class's mode (:mod:`gateway.routing.modes`): while speculating, spec iff the
   speed-up exceeds ``1 + margin``; in fallback, plain but for bounded probes.

Reasons come from the bounded vocabulary :data:`REASONS`.
"""

from __future__ import annotations

import math
from collections import Counter, deque

from gateway.routing.acceptance import (
    NGRAM_METHODS,
    KindLearner,
    ngram_prior,
    prior_tokens_per_step,
    temp_bucket,
)
from gateway.routing.config import RoutingConfig
from gateway.routing.costmodel import Costs, pair_costs
from gateway.routing.modes import ModeTracker, Prober
from gateway.routing.overlap import KINDS
from gateway.routing.rules import apply_hard_rules, decide_route
from gateway.routing.steptime import StepModel, get_step_model
from gateway.routing.types import Decision, EngineView, ModelView, Outcome, PairView, RequestFeatures, Route

REASONS: tuple[str, ...] = (
    "refused_params",
    "forced",
    "pinned",
    "spec_down",
    "base_down",
    "prior",
    "predicted_faster",
    "predicted_slower",
    "below_break_even",
    "probe",
    "high_load",
    "low_acceptance",
)
DEFAULT_K = 5
_UNKNOWN_DECAY_S = 30.0  # with no live acceptance, the correction relaxes to 1 on this half-life
_SCALE_MIN = 0.25  # bounds of the measured/profile step-time correction
_SCALE_MAX = 20.0


def _load(e: EngineView) -> float:
    scraped = (e.running or 0.0) + (e.waiting or 0.0)
    return max(float(e.inflight), scraped)


def _toward(old: float, new: float, dt: float, half_life: float) -> float:
    a = 1.0 - 0.5 ** (max(0.0, dt) / half_life) if half_life > 0 else 1.0
    return old + a * (new - old)


class AdaptivePolicy:
    name = "adaptive"

    def __init__(self, cfg: RoutingConfig | None = None, *, steps: StepModel | None = None) -> None:
        self.cfg = cfg or RoutingConfig(policy="adaptive")
        self.steps = steps or get_step_model(self.cfg.profile, self.cfg.context_tokens)
        self.learner = KindLearner(KINDS, half_life_s=self.cfg.learn_half_life_s)
        self.modes: dict[tuple[str, int], ModeTracker] = {}
        self.probers: dict[tuple[str, int], Prober] = {}
        self.recent: deque[dict[str, object]] = deque(maxlen=max(1, self.cfg.recent_decisions))
        self.reasons: Counter[str] = Counter()
        self.method = "ngram"
        self.k = DEFAULT_K
        # Live corrections (multiplicative, 1 = the model is right).
        self.live_ratio = 1.0
        self.live_measured = False
        self.scale_spec = 1.0
        self.scale_base = 1.0
        self._expected_al: float | None = None  # expected AL over drafted steps of spec traffic
        self._expected_e: float | None = None  # expected tokens/step of spec traffic (corrected)
        self._last_live = -math.inf
        self._last_costs: Costs | None = None
        self._last_view_key: tuple[object, ...] | None = None

    # -- the decision ---------------------------------------------------------------
    def decide(self, features: RequestFeatures, view: ModelView, now: float) -> Decision:
        pre = apply_hard_rules(features, view)
        if pre.decision is not None:
            return self._record(features, pre.decision, now, None)
        pair = pre.pair
        spec, base = pair.spec, pair.base
        self.method = (spec.method or "ngram").lower()
        self.k = spec.k if spec.k > 0 else DEFAULT_K
        self._refresh_live(pair, now)

        kind = features.kind if features.kind in KINDS else "chat"
        t = features.temperature
        prior_e, p_draft = self._prior(features)
        blended, evidence = self.learner.blend(kind, t, prior_e, now)
        e = 1.0 + (blended - 1.0) * self.live_ratio
        b_s, b_b = _load(spec), _load(base)
        costs = self._costs(b_s, b_b, e)
        speedup = costs.speedup
        self._last_costs = costs

        key = (kind, temp_bucket(t))
        mode = self.modes.get(key)
        if mode is None:
            mode = self.modes[key] = ModeTracker(
                self.cfg.margin, self.cfg.hysteresis, self.cfg.min_dwell_s, self.cfg.smoothing_s
            )
        speculating = mode.update(speedup, now)
        no_data = spec.stale and evidence == 0.0 and not self.live_measured
        threshold = 1.0 + self.cfg.margin

        probe = False
        if speculating:
            if speedup > threshold:
                route, reason = Route.SPEC, "prior" if no_data else "predicted_faster"
            else:
                route, reason = Route.BASE, "prior" if no_data else self._why_not(e, speedup, threshold)
        else:
            prober = self.probers.get(key)
            if prober is None:
                prober = self.probers[key] = Prober(
                    self.cfg.probe_share, self.cfg.probe_interval_s, last_probe=now
                )
            if prober.should_probe(now):
                route, reason, probe = Route.SPEC, "probe", True
            elif no_data:
                route, reason = Route.BASE, "prior"
            elif speedup > threshold:
                route, reason = Route.BASE, "below_break_even"  # held in fallback by hysteresis
            else:
                route, reason = Route.BASE, self._why_not(e, speedup, threshold)
        if route is Route.SPEC:
            self._track_expected(blended, p_draft, e)
        d = decide_route(
            pair,
            route,
            reason,
            predicted_speedup=round(speedup, 4),
            predicted_acceptance=round(e, 4),
            probe=probe,
        )
        return self._record(features, d, now, e)

    def _prior(self, f: RequestFeatures) -> tuple[float, float]:
        override = self.cfg.prior_tokens_per_step.get(self.method)
        if self.method in NGRAM_METHODS:
            e, p = ngram_prior(f.overlap, f.temperature, self.k)
            return (override if override is not None else e), p
        if override is not None:
            return override, 1.0
        return prior_tokens_per_step(self.method, f.overlap, f.temperature, self.k), 1.0

    def _costs(self, b_s: float, b_b: float, e: float) -> Costs:
        return pair_costs(
            self.steps,
            k=self.k,
            b_spec=b_s,
            b_base=b_b,
            tokens_per_step=e,
            scale_spec=self.scale_spec,
            scale_base=self.scale_base,
            marginal_weight=self.cfg.marginal_weight,
            margin=self.cfg.margin,
        )

    def _why_not(self, e: float, speedup: float, threshold: float) -> str:
        idle = self._costs(0.0, 0.0, e).speedup
        if idle > threshold:
            return "high_load"
        return "low_acceptance" if e < 1.5 else "predicted_slower"

    def _track_expected(self, blended: float, p_draft: float, e: float) -> None:
        al = 1.0 + (blended - 1.0) / max(p_draft, 0.05)
        self._expected_al = (
            al if self._expected_al is None else self._expected_al + 0.05 * (al - self._expected_al)
        )
        self._expected_e = e if self._expected_e is None else self._expected_e + 0.05 * (e - self._expected_e)

    # -- live corrections -----------------------------------------------------------
    def _refresh_live(self, pair: PairView, now: float) -> None:
        dt = now - self._last_live if math.isfinite(self._last_live) else 0.0
        self._last_live = now
        spec, base = pair.spec, pair.base
        hl = self.cfg.live_half_life_s
        al = spec.mean_acceptance_length
        if not spec.stale and al is not None and self._expected_al is not None and self._expected_al > 1.0:
            raw = min(1.5, max(0.05, (al - 1.0) / (self._expected_al - 1.0)))
            self.live_ratio = _toward(self.live_ratio, raw, dt if self.live_measured else 1e9, hl)
            self.live_measured = True
        else:
            self.live_ratio = _toward(self.live_ratio, 1.0, dt, _UNKNOWN_DECAY_S)
        if not self.cfg.fit_step_times:
            return
        view_key = (spec.tpot_s, base.tpot_s)
        if view_key == self._last_view_key:
            return  # fit once per new scrape, not once per request
        self._last_view_key = view_key
        b_s, b_b = max(_load(spec), 1.0), max(_load(base), 1.0)
        busy_s, busy_b = _load(spec) > 0, _load(base) > 0
        if not base.stale and base.tpot_s and base.tpot_s > 0:
            pred = self.scale_base * self.steps.step_ms(b_b, 1)
            if busy_s:
                pred += self.scale_spec * self.steps.step_ms(b_s, self.k + 1)
            raw = base.tpot_s * 1000.0 / pred
            self.scale_base = min(_SCALE_MAX, max(_SCALE_MIN, self.scale_base * raw**0.3))
        if not spec.stale and spec.tpot_s and spec.tpot_s > 0 and self._expected_e:
            pred = self.scale_spec * self.steps.step_ms(b_s, self.k + 1)
            if busy_b:
                pred += self.scale_base * self.steps.step_ms(b_b, 1)
            raw = spec.tpot_s * 1000.0 * self._expected_e / pred
            self.scale_spec = min(_SCALE_MAX, max(_SCALE_MIN, self.scale_spec * raw**0.3))

    # -- learning -------------------------------------------------------------------
    def observe(self, outcome: Outcome, now: float) -> None:
        if not outcome.ok:
            return
        kind = outcome.kind if outcome.kind in KINDS else "chat"
        if self.method in NGRAM_METHODS:
            if outcome.lookup_acceptance is not None:
                self.learner.observe(kind, outcome.temperature, outcome.lookup_acceptance * self.k, now)
        elif outcome.reported_mean_acceptance_length is not None:
            self.learner.observe(
                kind, outcome.temperature, outcome.reported_mean_acceptance_length - 1.0, now
            )

    # -- explainability -------------------------------------------------------------
    def _record(self, f: RequestFeatures, d: Decision, now: float, e: float | None) -> Decision:
        self.reasons[d.reason] += 1
        if self.cfg.recent_decisions > 0:
            self.recent.append(
                {
                    "t": round(now, 3),
                    "kind": f.kind,
                    "temperature": f.temperature,
                    "route": d.route.value,
                    "engine": d.engine,
                    "reason": d.reason,
                    "speedup": d.predicted_speedup,
                    "tokens_per_step": None if e is None else round(e, 3),
                    "probe": d.probe,
                }
            )
        return d

    def snapshot(self) -> dict[str, object]:
        now = self._last_live if math.isfinite(self._last_live) else 0.0
        eligible = sum(p.eligible for p in self.probers.values())
        probes = sum(p.probes for p in self.probers.values())
        c = self._last_costs
        return {
            "policy": self.name,
            "method": self.method,
            "k": self.k,
            "modes": {
                f"{kind}/t{b}": {
                    "mode": "speculating" if m.speculating else "fallback",
                    "smoothed_speedup": None if m.smoothed is None else round(m.smoothed, 4),
                    "flips": m.flips,
                }
                for (kind, b), m in sorted(self.modes.items())
            },
            "break_even_tokens_per_step": None if c is None else round(c.break_even_tokens_per_step, 4),
            "last_predicted_speedup": None if c is None else round(c.speedup, 4),
            "live_acceptance_ratio": round(self.live_ratio, 4),
            "step_scale": {"spec": round(self.scale_spec, 4), "base": round(self.scale_base, 4)},
            "learned": self.learner.snapshot(now),
            "probe_share": round(probes / eligible, 4) if eligible else 0.0,
            "probes": probes,
            "reasons": dict(self.reasons),
            "recent_decisions": list(self.recent),
        }
