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
from gateway.routing.acceptance import KindLearner, ngram_prior, prior_tokens_per_step
from gateway.routing.adaptive.calibration import LatencyBias
from gateway.routing.adaptive.context import ContextTracker
from gateway.routing.adaptive.costmodel import RegimeCosts, regime_costs
from gateway.routing.adaptive.explore import Explorer
from gateway.routing.adaptive.live import LiveCorrections, engine_load
from gateway.routing.adaptive.mix import MixEntry, MixPrice, TrafficMix
from gateway.routing.adaptive.modes import ModeTracker, Prober
from gateway.routing.adaptive.shared import SHARED_PREMIUM, DeviceView, SharedPair
from gateway.routing.config import RoutingConfig
from gateway.routing.overlap import KINDS
from gateway.routing.rules import apply_hard_rules, decide_route
from gateway.routing.steptime import StepModel, get_step_model
from gateway.routing.types import (
    Decision,
    ModelView,
    Outcome,
    PairView,
    Reason,
    RequestFeatures,
    Route,
)

DEFAULT_K = 5
# Outcome.extra key: draft tokens per step the n-gram replay of the answer realised.
LOOKUP_DRAFTS_KEY = "lookup_draft_tokens_per_step"
MODE_KEY = "all"  # one mode per model (the pair serves all classes in one regime)
_UNKNOWN_DECAY_S = 60.0  # with no live acceptance, the correction relaxes to 1 on this half-life
_HANDOVER_MAX = 1  # hand over only to an old engine about to idle (its last request)
# A quiet pair (requests in flight by Little's law, λ·D, at most 1.5; it stops being quiet
# above 3) idles often: each request may take the engine fastest for it.
_QUIET_ENTER = 1.5
_QUIET_LEAVE = 3.0
_IDLE_PREMIUM = 0.05  # a request alone on the pair goes to spec if that is 5 % faster for it
# A request's time per token teaches the bias only if the pair's mean load over its life
# stayed within 25 % (or 2 requests, on a light pair) of what it found on arrival.
_LOAD_DRIFT = 0.25
_LOAD_DRIFT_FLOOR = 8.0
_LOAD_HORIZON_S = 300.0  # how far back loads are kept (longer requests are not judged)
_PROBE_MIN_E = 1.5  # probes go to requests that would show whether speculation pays
# A peer heard from within this long (a witnessed request, a leader's regime) makes the
# channel live: the pair is then priced on the whole cluster's traffic and requests.
PEER_HOLD_S = 10.0


class AdaptivePolicy:
    name = "adaptive"

    def __init__(self, cfg: RoutingConfig | None = None, *, steps: StepModel | None = None) -> None:
        self.cfg = cfg or RoutingConfig(policy="adaptive")
        # The profile is read at the context the traffic holds (:mod:`.context`), unless a
        # step model is given (it is then taken as it is).
        self.context = ContextTracker(self.cfg.context_tokens)
        self._fixed_steps = steps
        self._steps_at: dict[int, StepModel] = {}
        self.steps = steps or self._steps_for(self.cfg.context_tokens)
        self.learner = KindLearner(KINDS, half_life_s=self.cfg.learn_half_life_s)
        # Per class, learned draft tokens per step (n-gram drafts only on a match).
        self.draft_learner = KindLearner(KINDS, half_life_s=self.cfg.learn_half_life_s)
        self.mode = ModeTracker(
            self.cfg.margin, self.cfg.hysteresis, self.cfg.switch_evidence, persist_s=self.cfg.persist_s
        )
        self.prober = Prober(self.cfg.probe_share, self.cfg.probe_interval_s)
        self.recent: deque[dict[str, object]] = deque(maxlen=max(1, self.cfg.recent_decisions))
        self.reasons: Counter[str] = Counter()
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
        self._last_costs: RegimeCosts | None = None
        self._routing: Route | None = None  # where the mode's traffic goes (lags a flip: _handover)
        self._duration_s = 2.0  # mean request duration (how long a handover may wait)
        self._decode_s = 2.0  # its decoding part (from the first token to the last)
        self._quiet = True  # see _quiet_pair
        self._busy = 0.0  # mean requests in flight that arrivals find
        # (time, requests in flight) at each decision, for as long as a request may live
        self._loads: deque[tuple[float, float]] = deque(maxlen=8192)
        self.shared = SharedPair()  # other gateway replicas' requests on the same pair
        self.explorer = Explorer()  # an engine whose step time is only assumed is run once
        # Peers (:mod:`.peers`): the regime the cluster's leader published (None: this
        # replica decides it), and until when the peer channel counts as live.
        self.leader_mode: bool | None = None
        self.leader_quiet: bool | None = None  # ...and whether it finds the pair quiet
        self._peered_until = -math.inf

    # -- the decision ---------------------------------------------------------------
    def decide(self, features: RequestFeatures, view: ModelView, now: float) -> Decision:
        pre = apply_hard_rules(features, view)
        self.bind(pre.pair.spec.method, pre.pair.spec.k)  # as configured, on every request
        if pre.decision is not None:
            self.shared.record(now, pre.pair.spec, pre.pair.base, pre.decision.route)
            return self._record(features, pre.decision, now, None)
        pair = pre.pair
        spec, base = pair.spec, pair.base
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
        costs, load = self._assess(engine_load(spec), engine_load(base), now, following=following)
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
        queued = (spec.stats.waiting or 0.0) > 0
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

    def _assess(
        self, spec_load: float, base_load: float, now: float, *, following: bool
    ) -> tuple[RegimeCosts, float]:
        """Price both regimes at the load a request found, and update the mode with the
        predicted speed-up (unless the leader's regime is followed). Returns (costs, load)."""
        load = self.live.batch(spec_load + base_load + 1.0)
        self.live.last_load = load
        self._loads.append((now, load))
        while self._loads and self._loads[0][0] < now - _LOAD_HORIZON_S:
            self._loads.popleft()
        costs = self._regime(load)
        self._last_costs = costs
        if not following:
            # A flip leaves the old engine's requests running beside the new one's: flip when
            # the old engine runs no more than arrivals usually find (not on a burst), which
            # keeps the drain, and the requests it slows, to the usual.
            old = spec_load if self.mode.speculating else base_load
            cheap = old <= max(1.0, self._busy)
            evidence = self.cfg.switch_evidence * self._drain_s()
            self.mode.update(costs.speedup, now, evidence, cheap=cheap, noise=self._noise(costs))
        return costs, load

    # -- peers (:mod:`.peers`) ------------------------------------------------------------
    def _peered(self, now: float) -> bool:
        """Whether a peer channel shows the other replicas' requests (lately heard)."""
        return now < self._peered_until

    def _shared(self, now: float) -> bool:
        """Whether the pair is shared with replicas this one does not hear from: then the
        engines' scrapes are the only evidence of them (:mod:`.shared`)."""
        return self.shared.shared(now) and not self._peered(now)

    def witness(
        self,
        features: RequestFeatures,
        route: Route,
        now: float,
        loads: tuple[float, float] | None = None,
    ) -> Route | None:
        """A peer replica routed a request: it joins the traffic this replica prices (the
        mix window) and, when sent to spec, what the spec engine's acceptance is compared
        with; with ``loads`` (the requests it found on the spec and the plain engine) the
        mode is updated at that load and the quiet-pair estimate counts it, as for this
        replica's own arrivals. Its outcome comes through :meth:`observe`. Returns the route
        whose streams move now, when the mode flipped (as ``Decision.move_from``)."""
        self._peered_until = now + PEER_HOLD_S
        kind, prior_e, p_draft, prior_q = self._enter_mix(features, now)
        if route is Route.SPEC:
            blended, _ = self.learner.blend(kind, features.temperature, prior_e, now)
            q, _ = self.draft_learner.blend(kind, features.temperature, prior_q, now)
            self.live.track_expected(now, blended, p_draft, q)
        if loads is None:
            return None
        was = self.mode.speculating
        self._assess(*loads, now, following=self.leader_mode is not None)
        self._quiet_pair(loads[0] + loads[1])
        return self._flip_moves(was)

    def follow_leader(
        self, speculating: bool | None, now: float, *, quiet: bool | None = None
    ) -> Route | None:
        """The regime the cluster's leader published (None: no leader, this replica decides
        alone), and whether it finds the pair quiet (requests then pick their engine one by
        one, :meth:`_quiet_pair`). Returns the route whose streams move now when the regime
        flipped (as ``Decision.move_from``): this replica's streams follow the leader's flip
        at once, as one gateway's do its own."""
        self.leader_quiet = quiet if speculating is not None else None
        was = self.mode.speculating
        if speculating is not None:
            self._peered_until = now + PEER_HOLD_S
            if speculating != self.mode.speculating:
                self.mode.follow(speculating)
                self.mode.last_flip = now
        self.leader_mode = speculating
        return self._flip_moves(was)

    def _enter_mix(self, f: RequestFeatures, now: float) -> tuple[str, float, float, float]:
        """A request routed by policy (this replica's or a peer's) joins the traffic the
        regimes are priced on: returns its class, prior tokens per step, prior chance of a
        draft and prior verified tokens per step."""
        kind = f.kind if f.kind in KINDS else "chat"
        prior_e, p_draft = self._prior(f)
        prior_q = 1.0 + p_draft * self.k if self.method in NGRAM_METHODS else float(self.k + 1)
        self.mix.add(MixEntry(now, self.learner.key(kind, f.temperature), prior_e, prior_q))
        return kind, prior_e, p_draft, prior_q

    def _regime_quiet(self) -> bool:
        """Whether the pair counts as quiet: the leader's view while following one (quiet
        and busy replicas would split the pair), else this replica's (:meth:`_quiet_pair`)."""
        if self.leader_mode is not None and self.leader_quiet is not None:
            return self.leader_quiet
        return self._quiet

    def regime(self) -> tuple[bool, bool]:
        """(speculating, quiet): what this replica tells the others while it leads."""
        return self.mode.speculating, self._quiet

    def _flip_moves(self, was: bool) -> Route | None:
        """The route whose streams move after a flip outside this replica's decisions (a
        peer's request, the leader's word): none on a quiet pair, whose requests pick their
        engine one by one, or without ``move_on_flip``."""
        if was == self.mode.speculating or self._regime_quiet() or not self.cfg.move_on_flip:
            return None
        self._routing = Route.SPEC if self.mode.speculating else Route.BASE  # moved: no handover
        return self._routing.other

    def _drain_s(self) -> float:
        """How long a flip's drain lasts: the old engine's requests run to their end, queue
        included, unless the flip moves them (``move_on_flip``); then the queued ones are
        re-sent at once and what is left is about one request's decoding (the streams that
        cannot move, and each moved one's new prefill). On a saturated pair requests queue
        for minutes, and evidence scaled by their whole life held a flip back for as long
        (a 2x slower GPU on the copy-heavy day: 330 s on the wrong regime)."""
        return self._decode_s if self.cfg.move_on_flip else self._duration_s

    def _quiet_pair(self, in_flight: float) -> bool:
        """Whether the pair is quiet: so few requests in flight that it idles often. Then a
        request that finds it idle takes the engine fastest for itself, and one that finds
        one engine running joins it (a split would make both pay both engines' steps); the
        regime is whatever the device runs.

        Measured, not predicted: the mean number in flight that arrivals find (Poisson
        arrivals see the time average, λ·D), over about the last ten arrivals, with
        hysteresis so that a load near the edge does not toggle it."""
        self._busy += 0.1 * (in_flight - self._busy)
        if self._quiet and self._busy > _QUIET_LEAVE:
            self._quiet = False
        elif not self._quiet and self._busy <= _QUIET_ENTER:
            self._quiet = True
        return self._quiet

    def _load_held(self, outcome: Outcome, now: float) -> float | None:
        """The load (batch) the request found, if the pair's load held while it ran (else
        None): its prediction was made at the load it found, and a request that met a
        rising (or falling) load measured that change, not the model's error. A cold start
        at high QPS fills the engine within the first requests' lives, and would teach the
        bias that the engine is slow."""
        if outcome.tpot_s is None or outcome.probe:
            return None
        start = now - (outcome.ttft_s or 0.0) - outcome.tpot_s * max(0, outcome.completion_tokens - 1)
        life: list[float] = []
        for t, n in reversed(self._loads):  # newest first, back to the request's start
            if t < start:
                break
            life.append(n)
        if not life:  # no other request arrived meanwhile: the load it found held
            return self._loads[-1][1] if self._loads else 1.0
        found, mean = life[-1], sum(life) / len(life)
        return found if abs(mean - found) <= _LOAD_DRIFT * max(found, _LOAD_DRIFT_FLOOR) else None

    def _handover(self, target: Route, pair: PairView, now: float, *, moving: bool = False) -> bool:
        """Whether the request still goes to the old mode's engine after a flip.

        A flip costs its drain: while the old engine still runs requests, every new one on
        the other engine waits for both engines' steps. When the old engine is down to its
        last request it is about to idle, and the flip is then nearly free: new requests
        keep going to it until it is idle, for at most one mean request duration. With more
        in flight, feeding it would only stretch the drain by a new request's whole life,
        so the switch is made at once. A flip that moves the old engine's streams
        (``moving``) empties it at once: nothing is handed over.
        """
        if moving or self._routing is None or self._routing is target:
            self._routing = target
            return False
        old = pair.spec if self._routing is Route.SPEC else pair.base
        about_to_idle = 0 < old.inflight <= _HANDOVER_MAX
        if not about_to_idle or now - self.mode.last_flip >= self._duration_s or not old.usable:
            self._routing = target
            return False
        return True

    def _probe_candidate(self, f: RequestFeatures, blended: float, device: DeviceView) -> bool:
        """Probes wake the spec engine, which slows every request on the device while they
        run (each cycle steps both engines): probe only when the plain engine is idle, so
        that the probe splits the pair with nobody but later arrivals, and with short
        requests that would show whether speculation pays. At 2 QPS, probing whatever
        request came every 30 s cost 2 % of the whole run's time per token."""
        short = f.max_tokens is not None and f.max_tokens <= self.cfg.probe_max_tokens
        return short and blended >= _PROBE_MIN_E and not device.runs_base

    def _recovery_would_flip(self, load: float) -> bool:
        """Whether fully recovered acceptance would bring the model back to speculating.

        Without that, a probe could not change any decision and only costs: while it runs,
        the spec engine's steps slow every request on the device.
        """
        if self.live.ratio >= 0.95:
            return False  # acceptance is not what holds the model in fallback: nothing to recover
        saved = self.live.ratio
        self.live.ratio = 1.0
        try:
            s = self._regime(load).speedup
        finally:
            self.live.ratio = saved
        return s > self.mode.upper

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
        now = self.live.last_update
        learned: dict[tuple[str, int], tuple[float, float, float, float]] = {}
        ngram = self.method in NGRAM_METHODS

        def price(m: MixEntry) -> tuple[float, float]:
            c = learned.get(m.klass)
            if c is None:
                c = learned[m.klass] = (
                    *self.learner.learned(m.klass, now),
                    *(self.draft_learner.learned(m.klass, now) if ngram else (0.0, 1.0)),
                )
            w, e, wq, q = c
            return (1.0 - w) * m.prior_tokens_per_step + w * e, (1.0 - wq) * m.prior_verified + wq * q

        knowledge = (self.learner.version, self.draft_learner.version, ngram)
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
            margin=self.mode.margin,
            method=self.method,
            k=self.k,
            prefill_per_token=self.live.prefill_per_token,
        )

    def _steps_for(self, ctx: int) -> StepModel:
        model = self._steps_at.get(ctx)
        if model is None:
            model = self._steps_at[ctx] = get_step_model(self.cfg.profile, ctx)
        return model

    # -- learning -------------------------------------------------------------------
    def observe(self, outcome: Outcome, now: float) -> None:
        if not outcome.ok:
            return
        self.context.observe(outcome.prompt_tokens, outcome.completion_tokens)
        if self._fixed_steps is None:
            self.steps = self._steps_for(self.context.bucket())
        found = self._load_held(outcome, now)
        if outcome.predicted_tpot_s is not None and outcome.tpot_s is not None and found is not None:
            tokens = outcome.completion_tokens
            self.bias.observe(outcome.route, outcome.tpot_s, outcome.predicted_tpot_s, tokens, now, found)
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
