"""The adaptive policy: the pure decision core (no I/O; state in, decision out).

Per request, after the hard rules (:func:`gateway.routing.rules.apply_hard_rules`):

1. predicted tokens per speculative step ``E`` for this request: the method prior
   (n-gram: from the predicted overlap and temperature; model drafters: published
   curves decaying with temperature), blended with what was learned for its class
   (:class:`~gateway.routing.acceptance.KindLearner`), scaled by the ratio of the spec
   engine's live windowed acceptance to what the router expected of the traffic it sent;
2. the traffic mix of the last seconds (its harmonic-mean E and mean verified tokens per
   step; a change of traffic ends the window, :mod:`.mix`), the pair's whole load, and
   step times of both engines from the calibration profile, scaled per load by their
   measured step time ÷ the profile's, the part common to both engines (the device) read
   from either (:mod:`.stepscale`); an engine only assumed so at the load is run there
   once (:mod:`.explore`);
3. both engines on one device timeline (:mod:`gateway.routing.adaptive.costmodel`): the
   predicted speed-up of serving the traffic on spec rather than on plain, which
   counts what each request costs the others (they share the batch and the device),
   corrected by what was measured: the spec engine's recent requests' time per token
   against what the model predicted for them, beyond the gap the plain engine shows
   (:mod:`gateway.routing.adaptive.calibration`);
4. the model's mode (:mod:`gateway.routing.adaptive.modes`): *speculating* sends traffic to spec,
   *fallback* to plain but for bounded probes; the mode flips when the speed-up's excess
   beyond ``1 + margin ± hysteresis``, integrated over
   time, pays for one drain (``switch_evidence`` × :meth:`AdaptivePolicy._drain_s`), at a moment
   the old engine runs no more requests than arrivals usually find (or once the evidence
   is twice that); after a flip new requests still join the old engine until it idles, for
   at most one request duration (the handover).

On a quiet pair (arrivals find at most ~1.5 requests in flight) the pair idles between
requests: one that finds it idle takes the engine fastest for itself, one that finds one
engine running joins it, and the mode follows what the device runs.

Gateway replicas in front of the same pair agree through the engines: what the scrapes
show beyond a replica's own requests is the others' regime (:mod:`.shared`). On such a
shared pair requests follow the regime, not the request, spec needs an extra premium, a
replica speculating while the others stay on plain comes back, and one in fallback while
the others all run spec follows them.

Splitting traffic between the two engines of a pair is avoided on purpose: on a shared
GPU both steps then run in every cycle, which is slower for everybody than either
regime (see :mod:`gateway.routing.adaptive.costmodel`). Reasons are
:class:`~gateway.routing.types.Reason` values.
"""

from __future__ import annotations

import math
from collections import Counter, deque

from gateway.physics.methods import NGRAM_METHODS
from gateway.routing.adaptive.live import engine_load
from gateway.routing.adaptive.pairstate import PairState
from gateway.routing.adaptive.pricing import LOOKUP_DRAFTS_KEY
from gateway.routing.adaptive.shared import SHARED_PREMIUM
from gateway.routing.config import RoutingConfig
from gateway.routing.overlap import KINDS
from gateway.routing.rules import apply_hard_rules, decide_route
from gateway.routing.steptime import StepModel
from gateway.routing.types import Decision, ModelView, Outcome, Reason, RequestFeatures, Route

__all__ = ["LOOKUP_DRAFTS_KEY", "MODE_KEY", "AdaptivePolicy"]

MODE_KEY = "all"  # one mode per model (the pair serves all classes in one regime)
_IDLE_PREMIUM = 0.05  # a request alone on the pair goes to spec if that is 5 % faster for it


class AdaptivePolicy(PairState):
    """The decision per request and the learning from each outcome, on the pair's state
    (:class:`~gateway.routing.adaptive.pairstate.PairState`) and the regimes' prices
    (:class:`~gateway.routing.adaptive.pricing.RegimePricing`)."""

    name = "adaptive"

    def __init__(self, cfg: RoutingConfig | None = None, *, steps: StepModel | None = None) -> None:
        super().__init__(cfg or RoutingConfig(policy="adaptive"), steps)
        self.recent: deque[dict[str, object]] = deque(maxlen=max(1, self.cfg.recent_decisions))
        self.reasons: Counter[str] = Counter()

    # -- the decision ---------------------------------------------------------------
    def decide(self, features: RequestFeatures, view: ModelView, now: float) -> Decision:
        pre = apply_hard_rules(features, view)
        pair = pre.pair
        spec, base = pair.spec, pair.base
        if spec is None or pre.decision is not None:
            if spec is not None:
                self.bind(spec.method, spec.k)  # as configured, on every request
                self.shared.record(now, spec, base, pre.decision.route if pre.decision else Route.BASE)
            assert pre.decision is not None  # the hard rules decide for a pair without spec
            return self._record(features, pre.decision, now, None)
        self.bind(spec.method, spec.k)  # as configured, on every request
        if self.prober.last_probe == -math.inf:
            self.prober.last_probe = now
        # A change point needs the traffic: a replica on a shared pair sees a share of it,
        # and a cut on a few of its own requests would take it away from the others' regime.
        self.mix.change_z = 0.0 if self._shared(now) else self.cfg.mix_change_z
        self.live.refresh(
            pair, now, self.steps, self._q_mix(), self.method, self.k, self._duration_s, self.context.mean()
        )

        kind, prior_e, p_draft, prior_q = self._enter_mix(features, now)
        blended, evidence = self.learner.blend(kind, features.temperature, prior_e, now)
        e = self._corrected(blended)
        q, _ = self.draft_learner.blend(kind, features.temperature, prior_q, now)
        in_flight = engine_load(spec) + engine_load(base)
        device = self.shared.view(spec, base, now)
        shared = self._shared(now)
        following = self.leader_mode is not None
        self.mode.premium = SHARED_PREMIUM if shared else 0.0
        was = self.mode.speculating
        queues = ((spec.stats.waiting or 0.0) > 0, (base.stats.waiting or 0.0) > 0)
        costs, load = self._assess(
            engine_load(spec), engine_load(base), now, following=following, queued=queues
        )
        speedup = costs.speedup
        speculating = self.mode.speculating
        # a pair shared with other replicas: no try at spec during a back-off, and back to
        # plain when the others stay there (adaptive.shared)
        tried_early = speculating and not was and now < self.shared.blocked_until
        if self._peered(now):
            pass  # the peers' channel shows the whole cluster's requests: nothing to infer
        elif tried_early or self.shared.back_to_plain(
            device, speculating=speculating, duration_s=self._duration_s, now=now
        ):
            self.mode.follow(False)
            speculating = False
        elif shared and self.shared.join_spec(
            device,
            speculating=speculating,
            last_flip=self.mode.last_flip,
            duration_s=self._duration_s,
            now=now,
        ):
            self.mode.follow(True)  # the others lead to spec: follow (adaptive.shared)
            speculating = True
        self._quiet_pair(in_flight)
        quiet = self._regime_quiet() and not shared
        queued = queues[0]
        explored: bool | None = None  # the engine being explored (True: spec), if one is
        if not quiet and not shared and not following:
            explorer, scales = self.explorer, self.live.scales
            if explorer.plain(
                scales, now, speculating=speculating, queued=queued, scale_spec=self.live.scale_spec
            ):
                explored = False
            elif explorer.spec(
                scales,
                now,
                speculating=speculating,
                load=load,
                could_pay=1.0 / self._inv_e_mix() > self.mode.upper,
                headroom=math.log(self.mode.upper / max(speedup, 1e-6)),
            ):
                explored = True
        exploring = explored is not None
        if explored is not None:
            speculating = explored
            self.mode.follow(speculating)
        elif self.explorer.spec_ended and speculating and speedup <= self.mode.upper:
            self.explorer.spec_ended = False  # measured: back to plain unless spec now pays
            speculating = False
            self.mode.follow(speculating)
        elif self.explorer.plain_ended and not speculating and speedup >= self.mode.lower:
            self.explorer.plain_ended = False  # measured: back to spec unless plain now pays
            speculating = True
            self.mode.follow(speculating)
        # A flip of the regime by evidence (not a quiet pair following its device): the old
        # engine's streams move to the new one where the gateway can (move_on_flip).
        moving = self.cfg.move_on_flip and speculating != was and not quiet
        no_data = evidence == 0.0 and not self.live.measured
        threshold = 1.0 + self.mode.margin

        probe = False
        target = Route.SPEC if speculating else Route.BASE
        decode_ms = (costs.spec_ms - costs.shared_ms) / self._inv_e_mix() / e
        own_spec_ms = decode_ms + costs.shared_ms  # this request's, on spec
        own = costs.base_ms / own_spec_ms if own_spec_ms > 0 else 1.0
        if quiet and not device.split:
            if device.runs_spec or device.runs_base:  # one engine running: join it
                route = Route.SPEC if device.runs_spec else Route.BASE
                reason = Reason.JOIN_RUNNING
            else:  # both idle: the engine fastest for this request
                route = Route.SPEC if own > 1.0 + _IDLE_PREMIUM else Route.BASE
                reason = Reason.PRIOR if no_data else Reason.IDLE_PAIR
            self._routing = route
            if not following:  # a follower's mode is the leader's
                self.mode.follow(route is Route.SPEC)
        elif self._handover(target, pair, now, moving=moving):
            route, reason = target.other, Reason.HANDOVER
        elif exploring:
            route, reason = target, Reason.EXPLORE
        elif speculating:
            route = Route.SPEC
            reason = (
                Reason.PRIOR
                if no_data
                else (Reason.PREDICTED_FASTER if speedup > threshold else Reason.HYSTERESIS)
            )
        elif (
            not following  # the leader probes for the cluster
            and self._probe_candidate(features, blended, device)
            and self._recovery_would_flip(load)
            and self.prober.should_probe(now)
        ):
            route, reason, probe = Route.SPEC, Reason.PROBE, True
        else:
            route = Route.BASE
            if speedup > threshold:
                reason = Reason.BELOW_BREAK_EVEN  # held in fallback: not enough evidence yet
            elif self._regime(1.0).speedup > 1.0:
                reason = Reason.HIGH_LOAD  # the measured load holds it here (unloaded, spec wins)
            else:
                # acceptance holds it here: as measured, or as the prior expects
                reason = Reason.PRIOR if no_data else Reason.LOW_ACCEPTANCE
        if route is Route.SPEC:
            self.live.track_expected(now, blended, p_draft, q)
        self.shared.record(now, spec, base, route)
        # What the model alone predicts for this request on its engine, for the bias to learn
        # from; only when the request will have the device to its engine (no probe, the
        # other engine idle). One that queues counts: its time per token starts at its
        # first token, in the engine's full batch, which the model prices at the cap.
        other_runs = device.runs_base if route is Route.SPEC else device.runs_spec
        predicted: float | None = None
        if not probe and not other_runs:
            ms = costs.base_ms
            if route is Route.SPEC:  # the model's own prediction
                ms = decode_ms / self.bias.factor(Route.SPEC, now, load) + costs.shared_ms
            predicted = ms / 1000.0
        d = decide_route(
            pair,
            route,
            reason,
            predicted_speedup=round(own, 4),
            predicted_acceptance=round(e, 4),
            probe=probe,
            predicted_tpot_s=predicted,
            move_from=target.other if moving else None,
        )
        return self._record(features, d, now, e)

    # -- learning -------------------------------------------------------------------
    def observe(self, outcome: Outcome, now: float) -> None:
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
            self._duration_s += 0.05 * (outcome.ttft_s + decode - self._duration_s)
            self._decode_s += 0.05 * (decode - self._decode_s)
        kind = outcome.kind if outcome.kind in KINDS else "chat"
        if not self._bound:
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
        now = self.live.last_update if math.isfinite(self.live.last_update) else 0.0
        c = self._last_costs
        m, p = self.mode, self.prober
        return {
            "policy": self.name,
            "method": self.method,
            "k": self.k,
            "mode": "speculating" if m.speculating else "fallback",
            "modes": {
                MODE_KEY: {
                    "mode": "speculating" if m.speculating else "fallback",
                    "predicted_speedup": None if m.last is None else round(m.last, 4),
                    "evidence_against": round(m.against, 4),
                    "prediction_noise": round(m.noise, 4),  # the band widens by it
                    "flips": m.flips,
                }
            },
            "context_tokens": round(self.context.mean()),
            "break_even_tokens_per_step": None if c is None else round(c.break_even_tokens_per_step, 4),
            "last_predicted_speedup": None if c is None else round(c.speedup, 4),
            "mix_tokens_per_step": round(1.0 / self._inv_e_mix(), 4),
            "mix_verified_tokens_per_step": round(self._q_mix(), 4),
            "live_acceptance_ratio": round(self.live.ratio, 4),
            "live_draft_ratio": round(self.live.q_ratio, 4),
            "step_scale": {"spec": round(self.live.scale_spec, 4), "base": round(self.live.scale_base, 4)},
            "measured_vs_model": self.bias.snapshot(now),
            "learned": self.learner.snapshot(now),
            # other gateway replicas' requests seen on the pair within the last minute
            "shared_pair": self.shared.shared(now),
            "probe_share": round(p.probes / p.eligible, 4) if p.eligible else 0.0,
            "probes": p.probes,
            "reasons": dict(self.reasons),
            "recent_decisions": list(self.recent),
        }
