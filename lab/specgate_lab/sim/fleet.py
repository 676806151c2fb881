"""A simulated fleet: ``N`` pairs, each on its own device, behind one gateway.

``--qps`` is the gateway's total. Policies: ``adaptive`` (:class:`~gateway.placement.FleetPolicy`:
a regime per pair, placement at the lowest marginal cost), ``one-regime`` (one adaptive
policy for every pair behind the least-loaded pair: the gateway before placement), the
statics (every pair in one regime, least-loaded pair), and ``assign:KINDS:S`` (the oracle's
candidates, :mod:`.oracle`: requests of the ``+``-joined KINDS on the first S pairs, all
speculating, the rest on the others, plain; least-loaded within each pool).

``pair_events`` take a pair away (``-1``: the newest active pair dies; its requests are
sent again to the others, as the gateway retries a stream whose engine vanished) or add
one (``+1``) mid-run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from gateway.pipeline.continuation import continuation_body, movable
from gateway.pipeline.request import CHAT, ParsedRequest
from gateway.placement import FleetPolicy
from gateway.routing.adaptive import AdaptivePolicy
from gateway.routing.config import RoutingConfig
from gateway.routing.factory import ADAPTIVE, build_policy
from gateway.routing.rules import choose_pair
from gateway.routing.types import Decision, ModelView, PairView, Policy, Reason, Route, RouteOverride
from specgate_lab.emulator.device import Device
from specgate_lab.emulator.engine import Engine, EngineRequest, TokenEvent
from specgate_lab.sim.monitor import ItlObserver, SimMonitor
from specgate_lab.sim.records import RequestRecord, SimConfig, SimResult
from specgate_lab.sim.run import MODEL, arrivals, engine_setup, outcome_of, parse_workload, settle, simulate
from specgate_lab.workload import WorkloadRequest

ONE_REGIME = "one-regime"
ASSIGN = "assign:"


@dataclass
class _Pair:
    index: int
    device: Device
    mons: dict[Route, SimMonitor]
    alive: bool = True

    def view(self, own: dict[str, int]) -> PairView:
        s, b = self.mons[Route.SPEC], self.mons[Route.BASE]
        return PairView(s.view(own[s.name]), b.view(own[b.name]), self.device.name)


class Assigned:
    """An oracle candidate: classes to pools fixed (module doc)."""

    name = "assign"

    def __init__(self, kinds: frozenset[str], spec_pairs: int) -> None:
        self.kinds, self.spec_pairs = kinds, spec_pairs

    def place(self, kind: str, pairs: list[PairView]) -> Decision:
        s = min(max(self.spec_pairs, 0), len(pairs))
        spec = (kind in self.kinds and s > 0) or s == len(pairs)
        pool = pairs[:s] if spec else pairs[s:]
        pair = choose_pair(ModelView(MODEL, tuple(pool)))
        eng = pair.speculative if spec else pair.base
        return Decision(route=eng.route, engine=eng.name, reason=Reason.PINNED)


def parse_assign(policy: str) -> Assigned:
    _, kinds, s = policy.split(":")
    return Assigned(frozenset(k for k in kinds.split("+") if k), int(s))


def simulate_fleet(cfg: SimConfig, workload: list[tuple[float, WorkloadRequest]] | None = None) -> SimResult:
    work = workload if workload is not None else arrivals(cfg)
    assigned = parse_assign(cfg.policy) if cfg.policy.startswith(ASSIGN) else None
    name = ADAPTIVE if cfg.policy == ONE_REGIME else cfg.policy
    policy: Policy | FleetPolicy | None = None
    if assigned is None:
        rcfg = RoutingConfig.model_validate({"policy": name, "profile": cfg.profile, **cfg.routing})
        policy = build_policy(rcfg)
        if cfg.policy == ADAPTIVE and isinstance(policy, AdaptivePolicy):
            policy = FleetPolicy(policy)
    spec_cfg, config, settings = engine_setup(cfg)
    pairs: list[_Pair] = []
    own: dict[str, int] = {}
    by_engine: dict[str, tuple[_Pair, Route]] = {}

    def add_pair() -> None:
        i = len(pairs)
        device = Device(f"gpu{i}")
        mons: dict[Route, SimMonitor] = {}
        for route in Route:
            obs = ItlObserver()
            if route is Route.SPEC:
                c = config(
                    spec=spec_cfg, spec_cost_scale=cfg.spec_cost_scale, spec_cost_slope=cfg.spec_cost_slope
                )
            else:
                c = config(spec=None)
            eng = device.attach(
                Engine(replace(c, seed=cfg.seed * 1000 + 2 * i + (route is Route.SPEC)), observer=obs)
            )
            if route is Route.SPEC:
                eng.step_overhead_ms = cfg.spec_overhead_ms
            nm = f"{route.value}{i}"
            mons[route] = SimMonitor(nm, route, eng, itl=obs)
            own[nm] = 0
        p = _Pair(i, device, mons)
        pairs.append(p)
        for route, m in mons.items():
            by_engine[m.name] = (p, route)

    for _ in range(max(1, cfg.pairs)):
        add_pair()
    by_req: dict[int, tuple[RequestRecord, EngineRequest, ParsedRequest, Decision, WorkloadRequest]] = {}
    records: list[RequestRecord] = []

    def on_events(events: list[TokenEvent]) -> None:
        for ev in events:
            entry = by_req.get(id(ev.request))
            if entry is None:
                continue
            if ev.tokens:
                entry[0].steps += 1
            if ev.request.finish_reason is None:
                continue
            del by_req[id(ev.request)]
            finish(*entry, ev.time)

    def finish(
        rec: RequestRecord,
        req: EngineRequest,
        parsed: ParsedRequest,
        d: Decision,
        wr: WorkloadRequest,
        now: float,
    ) -> None:
        settle(rec, req, now)
        own[d.engine] -= 1
        pair, route = by_engine[d.engine]
        pair.mons[route].finished(rec.tpot_s)
        if policy is None:
            return
        outcome = outcome_of(req, rec, parsed, d, route, d.engine, settings)
        policy.observe(outcome, now)

    def move(engine: str, t: float) -> None:
        """A flip's move on one pair: the old engine's streams go on on its sibling."""
        pair, old = by_engine[engine]
        to = pair.mons[old.other]
        for key, (rec, req, parsed, d, wr) in list(by_req.items()):
            if d.engine != engine or rec.migrated:
                continue
            if req.output and (
                not movable(parsed.body, CHAT)
                or continuation_body(parsed.body, CHAT, "".join(req.output), len(req.output), MODEL) is None
            ):
                continue
            events = pair.device.migrate(pair.mons[old].engine, to.engine, req, t)
            by_req[key] = (
                rec,
                req,
                parsed,
                replace(d, route=old.other, engine=to.name, predicted_tpot_s=None),
                wr,
            )
            own[engine] -= 1
            own[to.name] += 1
            rec.migrated = True
            on_events(events)

    def lose_pair(t: float) -> None:
        """The newest active pair dies: its requests are sent again (as fresh requests)."""
        alive = [p for p in pairs if p.alive]
        if len(alive) <= 1:
            return
        gone = alive[-1]
        gone.alive = False
        if isinstance(policy, FleetPolicy):
            policy.forget(gone.mons[Route.BASE].name)
        for key, (rec, _req, parsed, d, wr) in list(by_req.items()):
            if by_engine[d.engine][0] is gone:
                del by_req[key]
                own[d.engine] -= 1
                route_one(t, wr, parsed, rec)

    def route_one(
        t: float, wr: WorkloadRequest, parsed: ParsedRequest | None = None, again: RequestRecord | None = None
    ) -> None:
        parsed = parsed or parse_workload(wr, seeded=cfg.seeded_bodies)
        feats = parsed.features
        views = [p.view(own) for p in pairs if p.alive]
        if assigned is not None:
            d = assigned.place(wr.kind, views)
        else:
            assert policy is not None
            d = policy.decide(feats, ModelView(MODEL, tuple(views), RouteOverride.AUTO), t)
            if isinstance(policy, FleetPolicy):
                for eng in policy.take_moves():
                    move(eng, t)
            if d.move_from is not None and d.fallback is not None:
                move(d.fallback, t)
        pair, route = by_engine[d.engine]
        if again is None:
            rec = RequestRecord(
                t, wr.kind, wr.subkind, feats.kind, wr.temperature, route.value, d.reason, d.probe
            )
            records.append(rec)
        else:
            rec, rec.migrated, rec.route = again, True, route.value
        rec.engine = d.engine
        engine = pair.mons[route].engine
        req = engine.make_request(
            wr.prompt_text, max_tokens=wr.max_tokens, temperature=wr.temperature, seed=wr.seed
        )
        by_req[id(req)] = (rec, req, parsed, d, wr)
        own[d.engine] += 1
        on_events(pair.device.submit(engine, req, t))

    events: list[tuple[float, Callable[[float], None]]] = sorted(
        (t, (lambda _t: add_pair()) if delta > 0 else lose_pair) for t, delta in cfg.pair_events
    )
    i = 0
    next_scrape = 0.0
    end = (work[-1][0] if work else 0.0) + cfg.drain_s
    while True:
        t_arr = work[i][0] if i < len(work) else math.inf
        times = [(p.device.next_event_time() if p.alive else None) for p in pairs]
        t_dev = min((x for x in times if x is not None), default=math.inf)
        if t_arr == math.inf and t_dev == math.inf:
            break
        t_evt = events[0][0] if events else math.inf
        t = min(t_arr, t_dev, next_scrape, t_evt)
        if t > end:
            break
        for p, x in zip(pairs, times, strict=False):
            if x is not None and x <= t:
                on_events(p.device.run_until(t))
        if t >= next_scrape:
            for p in pairs:
                if p.alive:
                    on_events(p.device.run_until(t))  # counters as of now
                    for m in p.mons.values():
                        m.scrape(t)
            next_scrape += 1.0
        while events and events[0][0] <= t:
            events.pop(0)[1](t)
        if t >= t_arr:
            route_one(t, work[i][1])
            i += 1
    state: dict[str, object] = policy.snapshot() if policy is not None else {"policy": cfg.policy}
    return SimResult(cfg, records, state, max(p.device.t for p in pairs))


def is_fleet(cfg: SimConfig) -> bool:
    """Whether a run needs the fleet simulator (more than one pair, or pairs that change)."""
    return cfg.pairs > 1 or bool(cfg.pair_events) or cfg.policy == ONE_REGIME or cfg.policy.startswith(ASSIGN)


def simulate_any(cfg: SimConfig) -> SimResult:
    """One pair: :func:`specgate_lab.sim.run.simulate`, unchanged; a fleet: :func:`simulate_fleet`."""
    return simulate_fleet(cfg) if is_fleet(cfg) else simulate(cfg)


def join_delays(result: SimResult) -> list[float]:
    """Per pair added mid-run: seconds from its joining to the first request it took."""
    cfg = result.config
    joins = [t for t, d in sorted(cfg.pair_events) if d > 0]
    out = []
    for j, at in enumerate(joins):
        index = str(max(1, cfg.pairs) + j)  # its engines: spec<index>, base<index>
        took = [
            r.arrival for r in result.records if r.engine[4:] == index and r.arrival >= at
        ]  # spec3, base3
        out.append(min(took) - at if took else math.inf)
    return out
