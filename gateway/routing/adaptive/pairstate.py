"""The pair's regime between decisions: the state half of the adaptive policy
(:class:`~gateway.routing.adaptive.policy.AdaptivePolicy` builds on it).

* the **mode** (:mod:`.modes`), updated at the load each request finds (:meth:`PairState._assess`),
  and the evidence a flip needs: one drain (:meth:`PairState._drain_s`);
* a **quiet pair** (arrivals find at most ~1.5 requests in flight) idles between requests,
  so requests pick their engine one by one (:meth:`PairState._quiet_pair`);
* the **handover** after a flip: new requests join the old engine while it finishes its
  last request (:meth:`PairState._handover`);
* **probes** of spec while in fallback, only where recovered acceptance would flip the mode;
* **peers** (:mod:`gateway.peers`): other replicas' requests priced as this one's, the
  leader's regime followed, and the streams moved at its flips;
* the **load history** that tells whether a request's measured time per token is
  evidence about the model or about a load that changed under it.
"""

from __future__ import annotations

import math
from collections import deque

from gateway.routing.adaptive.costmodel import RegimeCosts
from gateway.routing.adaptive.explore import Explorer
from gateway.routing.adaptive.modes import ModeTracker, Prober
from gateway.routing.adaptive.pricing import RegimePricing
from gateway.routing.adaptive.shared import DeviceView, SharedPair
from gateway.routing.config import RoutingConfig
from gateway.routing.steptime import StepModel
from gateway.routing.types import Outcome, PairView, RequestFeatures, Route

_HANDOVER_MAX = 1  # hand over only to an old engine about to idle (its last request)
# A quiet pair (requests in flight by Little's law, λ·D, at most 1.5; it stops being quiet
# above 3) idles often: each request may take the engine fastest for it.
_QUIET_ENTER = 1.5
_QUIET_LEAVE = 3.0
# A request's time per token teaches the bias only if the pair's mean load over its life
# stayed within 25 % (or 2 requests, on a light pair) of what it found on arrival.
_LOAD_DRIFT = 0.25
_LOAD_DRIFT_FLOOR = 8.0
_LOAD_HORIZON_S = 300.0  # how far back loads are kept (longer requests are not judged)
_PROBE_MIN_E = 1.5  # probes go to requests that would show whether speculation pays
# A peer heard from within this long (a witnessed request, a leader's regime) makes the
# channel live: the pair is then priced on the whole cluster's traffic and requests.
PEER_HOLD_S = 10.0


class PairState(RegimePricing):
    """Mode, quietness, handover, probes, peers and load history of one model's pair."""

    def __init__(self, cfg: RoutingConfig, steps: StepModel | None) -> None:
        super().__init__(cfg, steps)
        self.mode = ModeTracker(
            self.cfg.margin, self.cfg.hysteresis, self.cfg.switch_evidence, persist_s=self.cfg.persist_s
        )
        self.prober = Prober(self.cfg.probe_share, self.cfg.probe_interval_s)
        self._last_costs: RegimeCosts | None = None
        self._routing: Route | None = None  # where the mode's traffic goes (lags a flip: _handover)
        self._duration_s = 2.0  # mean request duration (how long a handover may wait)
        self._decode_s = 2.0  # its decoding part (from the first token to the last)
        self._quiet = True  # see _quiet_pair
        self._busy = 0.0  # mean requests in flight that arrivals find
        # (time, requests in flight, the log of the live corrections the model applied to
        # spec and to plain) at each decision, for as long as a request may live
        self._loads: deque[tuple[float, float, float, float]] = deque(maxlen=8192)
        self.shared = SharedPair()  # other gateway replicas' requests on the same pair
        self.explorer = Explorer()  # an engine whose step time is only assumed is run once
        # Peers (:mod:`.peers`): the regime the cluster's leader published (None: this
        # replica decides it), and until when the peer channel counts as live.
        self.leader_mode: bool | None = None
        self.leader_quiet: bool | None = None  # ...and whether it finds the pair quiet
        self._peered_until = -math.inf

    def _assess(
        self,
        spec_load: float,
        base_load: float,
        now: float,
        *,
        following: bool,
        queued: tuple[bool, bool] = (False, False),
    ) -> tuple[RegimeCosts, float]:
        """Price both regimes at the load a request found, and update the mode with the
        predicted speed-up (unless the leader's regime is followed); ``queued``: whether the
        spec and the plain engine were seen queueing. Returns (costs, load)."""
        load = self.live.batch(spec_load + base_load + 1.0)
        self.live.last_load = load
        self._loads.append((now, load, *self._lens(load)))
        while self._loads and self._loads[0][0] < now - _LOAD_HORIZON_S:
            self._loads.popleft()
        costs = self._regime(load)
        self._last_costs = costs
        if not following:
            # A flip leaves the old engine's requests running beside the new one's: flip when
            # the old engine runs no more than arrivals usually find (not on a burst), which
            # keeps the drain, and the requests it slows, to the usual. An old engine that
            # queues is never a cheap flip: moving it re-prefills a whole batch on the new
            # engine and re-sends its queue there (on a real H200 such a flip-back cost the
            # moved batch 15-26 ms steps for 8 s); on a saturated pair with a few per cent
            # to gain, the flip waits for the queue to go.
            old = spec_load if self.mode.speculating else base_load
            old_queued = queued[0] if self.mode.speculating else queued[1]
            cheap = old <= max(1.0, self._busy) and not old_queued
            evidence = self.cfg.switch_evidence * self._drain_s()
            self.mode.update(costs.speedup, now, evidence, cheap=cheap, noise=self._noise(costs))
        return costs, load

    # -- peers (:mod:`gateway.peers`) ----------------------------------------------------
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

    def _lens(self, load: float, ratio: float | None = None) -> tuple[float, float]:
        """The log of the live corrections the model applies at ``load`` to spec (its step
        scale, and the acceptance correction: the mix's tokens per step as the prior and the
        learned classes expect ÷ as corrected by the live ratio, or by ``ratio`` when given)
        and to plain (its step scale); see :mod:`.calibration`."""
        e = 1.0 / max(self._inv_e_mix(), 1e-6)
        expected = 1.0 + (e - 1.0) / max(self.live.ratio, 0.05)
        if ratio is not None:
            e = 1.0 + (expected - 1.0) * max(ratio, 0.05)
        return (
            math.log(self.live.scale(True, load) * expected / e),
            math.log(self.live.scale(False, load)),
        )

    def _repriced(self, outcome: Outcome, now: float) -> tuple[float, float] | None:
        """The load the request found (if it held, :meth:`_load_held`) and the log of the
        live corrections its prediction was priced with ÷ those measured over its life (the
        latest window's acceptance, its engine's step time now): what the latency bias must
        not count (:mod:`.calibration`)."""
        held = self._load_held(outcome, now)
        if held is None:
            return None
        found, priced = held
        measured = self._lens(found, self.live.raw_ratio)[0 if outcome.route is Route.SPEC else 1]
        return found, priced - measured

    def _load_held(self, outcome: Outcome, now: float) -> tuple[float, float] | None:
        """The load (batch) the request found and the log of the live corrections its
        prediction was priced with (for its engine), if the pair's load held while it ran
        (else None): its prediction was made at the load it found, and a request that met a
        rising (or falling) load measured that change, not the model's error. A cold start
        at high QPS fills the engine within the first requests' lives, and would teach the
        bias that the engine is slow."""
        if outcome.tpot_s is None or outcome.probe:
            return None
        start = now - (outcome.ttft_s or 0.0) - outcome.tpot_s * max(0, outcome.completion_tokens - 1)
        col = 2 if outcome.route is Route.SPEC else 3
        life: list[tuple[float, float, float, float]] = []
        for entry in reversed(self._loads):  # newest first, back to the request's start
            if entry[0] < start:
                break
            life.append(entry)
        if not life:  # no other request arrived meanwhile: the load it found held
            if not self._loads:
                return 1.0, self._lens(1.0)[col - 2]
            return self._loads[-1][1], self._loads[-1][col]
        found, mean = life[-1][1], sum(e[1] for e in life) / len(life)
        if abs(mean - found) > _LOAD_DRIFT * max(found, _LOAD_DRIFT_FLOOR):
            return None
        return found, life[-1][col]

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
        old = pair.speculative if self._routing is Route.SPEC else pair.base
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
