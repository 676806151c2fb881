"""The adaptive policy: a pure decision core (no I/O; state in, decision out) composed of
small parts, each in its own module. Per request, a short pipeline:

0. **hard rules** (:func:`gateway.routing.rules.apply_hard_rules`), shared by every policy;
1. **estimate** (:class:`~.estimate.Estimator`): the request's tokens per step, and both
   regimes' time per token at the load it finds, from the physics prior corrected by
   what the gateway measured;
2. **regime** (:class:`~.controller.RegimeController`): the evidence switch, then the
   proposals of the shared pair (:class:`~.cluster.Cluster`) and of exploration, applied
   in one documented order; the controller is the only part that sets the mode;
3. **per-request overrides** (:mod:`.overrides`), asked in order, the first route wins:
   quiet pair, handover, exploring, probe; else the regime's own route.

Splitting traffic between the two engines of a pair is avoided on purpose: on a shared
GPU both steps then run in every cycle, which is slower for everybody than either regime
(:mod:`.costmodel`). What the gateway learns from answers goes to the estimator
(:meth:`AdaptivePolicy.observe`); peers' requests and a leader's regime come in through
:meth:`AdaptivePolicy.witness` and :meth:`AdaptivePolicy.follow_leader`.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

from gateway.routing.adaptive.cluster import Cluster
from gateway.routing.adaptive.controller import RegimeController
from gateway.routing.adaptive.costmodel import RegimeCosts
from gateway.routing.adaptive.estimate import LOOKUP_DRAFTS_KEY, Estimator, RequestEstimate
from gateway.routing.adaptive.knobs import REPORT_DIGITS, TIME_DIGITS
from gateway.routing.adaptive.live import engine_load
from gateway.routing.adaptive.overrides.exploring import Exploring
from gateway.routing.adaptive.overrides.handover import Handover
from gateway.routing.adaptive.overrides.probe import Probe
from gateway.routing.adaptive.overrides.quiet import QuietPair
from gateway.routing.adaptive.overrides.regime import RegimeRoute
from gateway.routing.adaptive.shared import DeviceView
from gateway.routing.adaptive.situation import Override, Pick, Situation
from gateway.routing.adaptive.state import policy_state
from gateway.routing.config import RoutingConfig
from gateway.routing.rules import Preliminary, apply_hard_rules, decide_route
from gateway.routing.steptime import StepModel
from gateway.routing.types import (
    Decision,
    EngineView,
    ModelView,
    Outcome,
    PairView,
    RequestFeatures,
    Route,
)

__all__ = ["LOOKUP_DRAFTS_KEY", "AdaptivePolicy"]


def _queues(e: EngineView) -> bool:
    return (e.stats.waiting or 0.0) > 0


@dataclass(slots=True)
class _Priced:
    """Step 1's result: a request and both regimes priced at the load it found."""

    features: RequestFeatures
    pair: PairView
    now: float
    request: RequestEstimate
    device: DeviceView
    costs: RegimeCosts
    load: float
    loads: tuple[float, float]  # requests on the spec and on the plain engine
    shared: bool  # the pair is shared with replicas this one does not hear from
    was: bool  # the mode before this request


class AdaptivePolicy:
    """The decision per request and the learning from each outcome (module doc)."""

    name = "adaptive"

    def __init__(self, cfg: RoutingConfig | None = None, *, steps: StepModel | None = None) -> None:
        self.cfg = cfg or RoutingConfig(policy="adaptive")
        self.estimator = Estimator(self.cfg, steps)
        self.controller = RegimeController(self.cfg)
        self.cluster = Cluster()
        self.quiet = QuietPair()
        self.handover = Handover()
        self.probe = Probe(self.cfg, self.estimator)
        self.overrides: tuple[Override, ...] = (self.quiet, self.handover, Exploring(), self.probe)
        self.regime_route = RegimeRoute(self.estimator)
        self.recent: deque[dict[str, object]] = deque(maxlen=max(1, self.cfg.recent_decisions))
        self.reasons: Counter[str] = Counter()

    # -- the decision ---------------------------------------------------------------
    def decide(self, features: RequestFeatures, view: ModelView, now: float) -> Decision:
        pre = apply_hard_rules(features, view)  # 0. hard rules, shared by every policy
        spec = pre.pair.spec
        if spec is None or pre.decision is not None:
            return self._ruled(features, pre, now)
        self.estimator.bind(spec.method, spec.k)  # as configured, on every request
        self.probe.arm(now)
        s = self._settle(self._estimate(features, pre.pair, now))  # 1. estimate, 2. regime
        # 3. per-request overrides, in order; the regime's own route when none takes it
        pick = next((p for o in self.overrides if (p := o.route(s)) is not None), None)
        return self._decision(s, pick or self.regime_route.route(s))

    def _estimate(self, features: RequestFeatures, pair: PairView, now: float) -> _Priced:
        """1. The request's tokens per step, and both regimes priced at the load it finds."""
        est, peers = self.estimator, self.cluster
        spec, base = pair.speculative, pair.base
        est.refresh(pair, now, shared=peers.shared(now))
        request = est.request(features, now)
        device = peers.device(spec, base, now)
        shared = peers.shared(now)
        self.controller.premium(peers.premium(shared))
        loads = (engine_load(spec), engine_load(base))
        was = self.controller.speculating
        costs, load = est.price_at(*loads, now)
        return _Priced(features, pair, now, request, device, costs, load, loads, shared, was)

    def _settle(self, p: _Priced) -> Situation:
        """2. The regime, in the controller's order: the evidence, the shared pair's
        proposal, exploration; then what the overrides read."""
        est, ctl, peers, now = self.estimator, self.controller, self.cluster, p.now
        spec, base = p.pair.speculative, p.pair.base
        following = peers.following
        if not following:
            self._weigh(p.costs, p.loads, now, queued=(_queues(spec), _queues(base)))
        last_flip, duration_s = ctl.mode.last_flip, est.duration_s
        ctl.propose(
            peers.proposal(
                p.device,
                speculating=ctl.speculating,
                was=p.was,
                last_flip=last_flip,
                duration_s=duration_s,
                now=now,
            )
        )
        self.quiet.observe(p.loads[0] + p.loads[1])
        quiet = peers.quiet(self.quiet.quiet) and not p.shared
        exploring = ctl.explore(
            est.live.scales,
            now,
            active=not quiet and not p.shared and not following,
            speedup=p.costs.speedup,
            load=p.load,
            queued=_queues(spec),
            scale_spec=est.live.scale_spec,
            mix_tokens_per_step=1.0 / est.inv_e_mix(),
        )
        speculating, mode = ctl.speculating, ctl.mode
        own, decode_ms = est.own(p.costs, p.request.e)
        return Situation(
            p.features, p.pair, now, p.request, p.device, p.costs, p.load,
            speculating=speculating,
            target=Route.SPEC if speculating else Route.BASE,
            last_flip=mode.last_flip,
            quiet=quiet,
            following=following,
            exploring=exploring,
            moving=self.cfg.move_on_flip and speculating != p.was and not quiet,
            own_speedup=own,
            decode_ms=decode_ms,
            no_data=p.request.evidence == 0.0 and not est.live.measured,
            threshold=1.0 + mode.margin,
            upper=mode.upper,
            duration_s=duration_s,
        )  # fmt: skip

    def _decision(self, s: Situation, pick: Pick) -> Decision:
        """The request's decision from the override (or regime) that routed it; what the
        model alone predicts goes with it, for the latency bias to learn from, when the
        request has the device to its engine (no probe, the other engine idle)."""
        est, r, now = self.estimator, s.request, s.now
        if pick.sets_regime:  # a quiet pair's regime is what its device runs
            self.handover.routing = pick.route
            if not s.following:  # a follower's mode is the leader's
                self.controller.propose(pick.route is Route.SPEC)
        if pick.route is Route.SPEC:
            est.live.track_expected(now, r.blended, r.p_draft, r.q)
        self.cluster.pair.record(now, s.pair.speculative, s.pair.base, pick.route)
        other_runs = s.device.runs_base if pick.route is Route.SPEC else s.device.runs_spec
        clean = not pick.probe and not other_runs
        d = decide_route(
            s.pair,
            pick.route,
            pick.reason,
            predicted_speedup=round(s.own_speedup, REPORT_DIGITS),
            predicted_acceptance=round(r.e, REPORT_DIGITS),
            probe=pick.probe,
            predicted_tpot_s=est.predicted_tpot_s(pick.route, s.costs, s.decode_ms, s.load, now)
            if clean
            else None,
            move_from=s.target.other if s.moving else None,
        )
        return self._record(s.features, d, now, r.e)

    def _ruled(self, features: RequestFeatures, pre: Preliminary, now: float) -> Decision:
        """A request the hard rules decided (or a pair without spec)."""
        spec = pre.pair.spec
        if spec is not None:
            self.estimator.bind(spec.method, spec.k)  # as configured, on every request
            route = pre.decision.route if pre.decision else Route.BASE
            self.cluster.pair.record(now, spec, pre.pair.base, route)
        assert pre.decision is not None  # the hard rules decide for a pair without spec
        return self._record(features, pre.decision, now, None)

    def _weigh(
        self, costs: RegimeCosts, loads: tuple[float, float], now: float, *, queued: tuple[bool, bool]
    ) -> None:
        """Feed the evidence switch the predicted speed-up at the load a request found."""
        est = self.estimator
        self.controller.weigh(
            costs.speedup,
            now,
            loads=loads,
            queued=queued,
            busy=self.quiet.busy,
            drain_s=est.drain_s(),
            noise=est.noise(costs),
        )

    # -- learning -------------------------------------------------------------------
    def bind(self, method: str | None, k: int) -> None:
        """The spec engine's method and k (:class:`~gateway.routing.types.PairBound`)."""
        self.estimator.bind(method, k)

    def observe(self, outcome: Outcome, now: float) -> None:
        self.estimator.observe(outcome, now)

    # -- peers (:mod:`gateway.peers`) ----------------------------------------------
    def witness(
        self, features: RequestFeatures, route: Route, now: float, loads: tuple[float, float] | None = None
    ) -> Route | None:
        """A peer replica routed a request: it joins the traffic this replica prices and,
        when sent to spec, what the spec engine's acceptance is compared with; with
        ``loads`` (the requests it found on the spec and the plain engine) the regime is
        updated at that load and the quiet-pair estimate counts it, as for this replica's
        own arrivals. Returns the route whose streams move now, when the mode flipped."""
        self.cluster.heard(now)
        est = self.estimator
        entered = est.enter(features, now)
        if route is Route.SPEC:
            r = est.blend(features, entered, now)
            est.live.track_expected(now, r.blended, r.p_draft, r.q)
        if loads is None:
            return None
        was = self.controller.speculating
        costs, _ = est.price_at(*loads, now)
        if not self.cluster.following:
            self._weigh(costs, loads, now, queued=(False, False))
        self.quiet.observe(loads[0] + loads[1])
        return self._flip_moves(was)

    def follow_leader(
        self, speculating: bool | None, now: float, *, quiet: bool | None = None
    ) -> Route | None:
        """The regime the cluster's leader published (None: no leader, this replica decides
        alone), and whether it finds the pair quiet. Returns the route whose streams move
        now when the regime flipped: this replica's streams follow the leader's flip at once."""
        was = self.controller.speculating
        self.cluster.follow(speculating, now, quiet)
        if speculating is not None:
            self.controller.follow_leader(speculating, now)
        return self._flip_moves(was)

    def regime(self) -> tuple[bool, bool]:
        """(speculating, quiet): what this replica tells the others while it leads."""
        return self.controller.speculating, self.quiet.quiet

    def _flip_moves(self, was: bool) -> Route | None:
        """The route whose streams move after a flip outside this replica's decisions (a
        peer's request, the leader's word): none on a quiet pair, whose requests pick their
        engine one by one, or without ``move_on_flip``."""
        speculating = self.controller.speculating
        if was == speculating or self.cluster.quiet(self.quiet.quiet) or not self.cfg.move_on_flip:
            return None
        self.handover.routing = Route.SPEC if speculating else Route.BASE  # moved: no handover
        return self.handover.routing.other

    # -- explainability -------------------------------------------------------------
    def _record(self, f: RequestFeatures, d: Decision, now: float, e: float | None) -> Decision:
        self.reasons[d.reason] += 1
        if self.cfg.recent_decisions > 0:
            self.recent.append(
                {
                    "t": round(now, TIME_DIGITS),
                    "kind": f.kind,
                    "temperature": f.temperature,
                    "route": d.route.value,
                    "engine": d.engine,
                    "reason": d.reason,
                    "speedup": d.predicted_speedup,
                    "tokens_per_step": None if e is None else round(e, TIME_DIGITS),
                    "probe": d.probe,
                }
            )
        return d

    def snapshot(self) -> dict[str, object]:
        return policy_state(
            self.name,
            self.estimator,
            self.controller,
            self.cluster,
            self.probe.prober,
            self.reasons,
            self.recent,
        )
