"""One simulated run: Poisson arrivals of a mixed workload, one policy, one QPS."""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import replace

from gateway.physics.methods import PROMPT_LOOKUP_METHODS
from gateway.pipeline.continuation import continuation_body, movable
from gateway.pipeline.outcome import Answer, LookupSettings, build_outcome, replay_lookup
from gateway.pipeline.request import CHAT, ParsedRequest, parse_request
from gateway.routing.adaptive import AdaptivePolicy
from gateway.routing.adaptive.live import engine_load
from gateway.routing.config import RoutingConfig
from gateway.routing.factory import ALWAYS_SPEC, build_policy
from gateway.routing.types import HARD_RULE_REASONS, Decision, ModelView, Outcome, PairView, Route
from specgate_lab.emulator.device import Device
from specgate_lab.emulator.engine import Engine, EngineConfig, EngineRequest, TokenEvent
from specgate_lab.emulator.spec import SpecConfig, parse_spec_config
from specgate_lab.sim.agreement import Sample
from specgate_lab.sim.monitor import ItlObserver, SimMonitor
from specgate_lab.sim.records import RequestRecord, SimConfig, SimResult
from specgate_lab.sim.scenarios import Phase, scenario_requests
from specgate_lab.workload import WorkloadRequest, to_openai_body

MODEL = "qwen3-8b"
# A setup rather than a routing policy: one Dynamic SD engine alone serves all traffic.
DYNAMIC_SD = "dynamic-sd"


_SAMPLE_S = 0.1  # how often the replicas' modes and the engines' running counts are sampled


def run_phases(cfg: SimConfig) -> tuple[Phase, ...]:
    return cfg.phases or (Phase(cfg.duration_s, cfg.qps, cfg.qps),)


def arrivals(cfg: SimConfig) -> list[tuple[float, WorkloadRequest]]:
    """Poisson arrivals (time-varying over ``phases`` if given) with their requests.

    The same for every policy: runs are paired.
    """
    return scenario_requests(
        run_phases(cfg),
        seed=cfg.seed,
        mix=cfg.mix,
        temperature=cfg.temperature,
        max_tokens_cap=cfg.max_tokens_cap,
    )


def phase_summaries(result: SimResult) -> list[dict[str, float | int | str]]:
    """Per-phase summaries of a phased run (requests grouped by arrival phase)."""
    out = []
    start = 0.0
    for ph in result.config.phases:
        recs = [r for r in result.records if start <= r.arrival < start + ph.duration_s]
        sub = SimResult(replace(result.config, qps=ph.start_qps), recs, {}, result.sim_end)
        row = sub.summary(warmup_s=0.0)
        row["phase_start_s"] = start
        row["qps"] = ph.start_qps if ph.start_qps == ph.end_qps else f"{ph.start_qps:g}-{ph.end_qps:g}"
        out.append(row)
        start += ph.duration_s
    return out


def parse_workload(wr: WorkloadRequest, *, seeded: bool = False) -> ParsedRequest:
    """A workload request as the gateway would see it: its chat body (with its seed when
    ``seeded``) through the shared pipeline."""
    return parse_request(to_openai_body(wr, MODEL, seeded=seeded), CHAT, None, allow_override=False)


def settle(rec: RequestRecord, req: EngineRequest, now: float) -> None:
    """A finished request's figures on its record: tokens, finish, TTFT (from the client's
    arrival) and TPOT."""
    n = len(req.output)
    rec.output_tokens, rec.finished_at = n, now
    if req.first_token_at is not None:
        rec.ttft_s = req.first_token_at - rec.arrival
        if n > 1 and req.finished_at is not None:
            rec.tpot_s = (req.finished_at - req.first_token_at) / (n - 1)


def outcome_of(
    req: EngineRequest,
    rec: RequestRecord,
    parsed: ParsedRequest,
    d: Decision,
    route: Route,
    engine: str,
    settings: LookupSettings,
) -> Outcome:
    """What the gateway learns from a finished request: the answer as its proxy would have
    seen it (vLLM's reported acceptance on spec), and the prompt-lookup replay of its text."""
    summary = req.spec_summary() if route is Route.SPEC else None
    reported = summary.get("mean_acceptance_length") if summary and req.num_drafts else None
    answer = Answer(
        route=route,
        engine=engine,
        ok=True,
        started=req.arrival,
        first_token_at=req.first_token_at,
        last_token_at=req.finished_at,
        completion_tokens=len(req.output),
        prompt_tokens=req.num_prompt_tokens,
        reported_mean_acceptance_length=float(reported) if isinstance(reported, float) else None,
        steps=rec.steps,
    )
    lookup = replay_lookup(parsed.prompt_text, "".join(req.output), settings)
    return build_outcome(
        parsed.features, answer, probe=d.probe, lookup=lookup, predicted_tpot_s=d.predicted_tpot_s
    )


def engine_setup(
    cfg: SimConfig, *, dynamic: bool = False
) -> tuple[SpecConfig, Callable[..., EngineConfig], LookupSettings]:
    """A run's speculative config (vLLM's ``--speculative-config`` from the run's method, k,
    n-gram sizes and extras; Dynamic SD's per-batch k when ``dynamic``), the engine config
    both engines of a pair share (model, profile, device errors; the spec engine adds its
    drafter), and the prompt-lookup settings the gateway replays answers with."""
    raw_spec: dict[str, object] = {"method": cfg.method, "num_speculative_tokens": cfg.k}
    if cfg.method in PROMPT_LOOKUP_METHODS:
        raw_spec.update(prompt_lookup_min=cfg.prompt_lookup_min, prompt_lookup_max=cfg.prompt_lookup_max)
    raw_spec.update(cfg.spec_extra)
    if dynamic:
        raw_spec["num_speculative_tokens_per_batch_size"] = [list(e) for e in cfg.dynamic_k]
    spec_cfg = parse_spec_config(raw_spec)
    assert spec_cfg is not None
    config = functools.partial(
        EngineConfig,
        MODEL,
        profile=cfg.profile,
        seed=cfg.seed,
        max_num_seqs=cfg.max_num_seqs,
        device_scale=cfg.device_scale,
        device_scale_slope=cfg.device_scale_slope,
    )
    settings = LookupSettings.of(spec_cfg.k, spec_cfg.prompt_lookup_min, spec_cfg.prompt_lookup_max)
    return spec_cfg, config, settings


def simulate(cfg: SimConfig, workload: list[tuple[float, WorkloadRequest]] | None = None) -> SimResult:
    work = workload if workload is not None else arrivals(cfg)
    # dynamic-sd: one engine with vLLM's Dynamic SD serves everything (no plain sibling).
    dynamic = cfg.policy == DYNAMIC_SD
    name = ALWAYS_SPEC if dynamic else cfg.policy
    rcfg = RoutingConfig.model_validate({"policy": name, "profile": cfg.profile, **cfg.routing})
    policies = [build_policy(rcfg) for _ in range(max(1, cfg.replicas))]
    spec_cfg, config, lookup_settings = engine_setup(cfg, dynamic=dynamic)
    device = Device("gpu0")
    obs_s, obs_b = ItlObserver(), ItlObserver()
    spec_eng = device.attach(
        Engine(
            config(spec=spec_cfg, spec_cost_scale=cfg.spec_cost_scale, spec_cost_slope=cfg.spec_cost_slope),
            observer=obs_s,
        )
    )
    spec_eng.step_overhead_ms = cfg.spec_overhead_ms
    base_eng = Engine(config(spec=None), observer=obs_b)
    if not dynamic:
        device.attach(base_eng)
    mons = {
        Route.SPEC: SimMonitor("spec", Route.SPEC, spec_eng, itl=obs_s),
        Route.BASE: SimMonitor("base", Route.BASE, base_eng, itl=obs_b),
    }
    # requests in flight per (replica, engine): what each replica's gateway counts itself
    own: dict[tuple[int, Route], int] = {(r, e): 0 for r in range(len(policies)) for e in Route}
    # the peer channel: what replica r last heard of replica q's requests in flight, and
    # messages on their way (delivery time, order, delivery)
    n_rep = len(policies)
    heard: dict[tuple[int, int, Route], int] = {}
    mail: list[tuple[float, int, Callable[[], None]]] = []
    order = itertools.count()
    leader_said: list[tuple[bool, bool] | None] = [None]

    def send(t: float, src: int, deliver: Callable[[int, float], None]) -> None:
        """Every other replica gets ``deliver(replica, arrival time)`` after the lag."""
        if not cfg.peers:
            return
        at = t + cfg.peer_lag_s
        for r in range(n_rep):
            if r != src:
                item: tuple[float, int, Callable[[], None]] = (
                    at,
                    next(order),
                    functools.partial(deliver, r, at),
                )
                heapq.heappush(mail, item)

    def count(replica: int, route: Route, delta: int, t: float) -> None:
        own[replica, route] += delta
        n = own[replica, route]

        def hear(r: int, _at: float) -> None:
            heard[r, replica, route] = n

        send(t, replica, hear)

    def publish(t: float) -> None:
        """The leader (replica 0) tells the others its regime when it changed."""
        regime = _regime(policies[0])
        if cfg.peers and regime is not None and regime != leader_said[0]:
            leader_said[0] = regime

            def follow(r: int, at: float) -> None:
                p = policies[r]
                if isinstance(p, AdaptivePolicy) and (old := p.follow_leader(regime[0], at, quiet=regime[1])):
                    move(r, old, at)

            send(t, 0, follow)

    def inflight(replica: int, route: Route) -> int:
        """The requests a replica counts on an engine: its own and, with peers, the others'
        as last heard."""
        others = sum(heard.get((replica, q, route), 0) for q in range(n_rep) if q != replica)
        return own[replica, route] + others

    by_req: dict[int, tuple[RequestRecord, EngineRequest, ParsedRequest, Decision]] = {}
    records: list[RequestRecord] = []

    def on_events(events: list[TokenEvent]) -> None:
        for ev in events:
            req = ev.request
            entry = by_req.get(id(req))
            if entry is None:
                continue
            rec = entry[0]
            if ev.tokens:
                rec.steps += 1
            if req.finish_reason is None:
                continue
            del by_req[id(req)]
            finish(*entry, ev.time)

    def finish(
        rec: RequestRecord,
        req: EngineRequest,
        parsed: ParsedRequest,
        d: Decision,
        now: float,
    ) -> None:
        route = d.route
        settle(rec, req, now)
        mon = mons[route]
        count(rec.replica, route, -1, now)
        mon.finished(rec.tpot_s)
        outcome = outcome_of(req, rec, parsed, d, route, mon.name, lookup_settings)
        policies[rec.replica].observe(outcome, now)
        send(now, rec.replica, lambda r, at: policies[r].observe(outcome, at))

    def move(replica: int, old: Route, t: float) -> None:
        """A flip's move (``Decision.move_from``): this replica's streams on ``old`` that the
        gateway could continue elsewhere (:mod:`gateway.pipeline.continuation`) go on on the
        sibling, which prefills their prompt and the text so far."""
        to = old.other
        for key in list(by_req):
            entry = by_req.get(key)
            if entry is None:
                continue
            rec, req, parsed, d = entry
            if rec.replica != replica or d.route is not old or rec.migrated:
                continue
            if req.output and (  # begun: a stream that can be continued; else queued: sent again
                not movable(parsed.body, CHAT)
                or continuation_body(parsed.body, CHAT, "".join(req.output), len(req.output), MODEL) is None
            ):
                continue
            events = device.migrate(mons[old].engine, mons[to].engine, req, t)
            by_req[key] = (rec, req, parsed, replace(d, route=to, predicted_tpot_s=None))
            count(replica, old, -1, t)
            count(replica, to, 1, t)
            rec.migrated = True
            on_events(events)

    def route_one(t: float, wr: WorkloadRequest, replica: int) -> None:
        parsed = parse_workload(wr, seeded=cfg.seeded_bodies)
        feats = parsed.features
        pair = PairView(
            mons[Route.SPEC].view(inflight(replica, Route.SPEC)),
            mons[Route.BASE].view(inflight(replica, Route.BASE)),
            "gpu0",
        )
        policy = policies[replica]
        d = policy.decide(feats, ModelView(MODEL, (pair,)), t)
        if cfg.peers and d.reason not in HARD_RULE_REASONS:
            loads = (engine_load(pair.speculative), engine_load(pair.base))

            def witness(r: int, at: float) -> None:
                p = policies[r]
                if isinstance(p, AdaptivePolicy) and (old := p.witness(feats, d.route, at, loads)):
                    move(r, old, at)

            send(t, replica, witness)
        publish(t)
        if d.move_from is not None:
            move(replica, d.move_from, t)
        mon = mons[d.route]
        rec = RequestRecord(
            t,
            wr.kind,
            wr.subkind,
            feats.kind,
            wr.temperature,
            d.route.value,
            d.reason,
            d.probe,
            replica=replica,
        )
        records.append(rec)
        eng = mon.engine
        req = eng.make_request(
            wr.prompt_text, max_tokens=wr.max_tokens, temperature=wr.temperature, seed=wr.seed
        )
        by_req[id(req)] = (rec, req, parsed, d)
        count(replica, d.route, 1, t)
        on_events(device.submit(eng, req, t))

    samples: list[Sample] = []
    i = 0
    next_scrape = next_sample = 0.0
    end = (work[-1][0] if work else 0.0) + cfg.drain_s
    while True:
        t_arr = work[i][0] if i < len(work) else math.inf
        t_dev = device.next_event_time()
        t_dev = math.inf if t_dev is None else t_dev
        if t_arr == math.inf and t_dev == math.inf:
            break
        t_mail = mail[0][0] if mail else math.inf
        t = min(t_arr, t_dev, next_scrape, next_sample, t_mail)
        if t > end:
            break
        on_events(device.run_until(t))
        while mail and mail[0][0] <= t:
            heapq.heappop(mail)[2]()
            publish(t)
        if t >= next_sample:
            modes = tuple(_mode(p) for p in policies)
            samples.append(Sample(t, modes, (float(spec_eng.num_running), float(base_eng.num_running))))
            next_sample += _SAMPLE_S
        if t >= next_scrape:
            for m in mons.values():
                m.scrape(t)
            next_scrape += 1.0
        if t >= t_arr:
            route_one(t, work[i][1], i % len(policies))
            i += 1
    return SimResult(cfg, records, policies[0].snapshot(), device.t, samples)


def _regime(policy: object) -> tuple[bool, bool] | None:
    """What a leader publishes: (speculating, quiet)."""
    return policy.regime() if isinstance(policy, AdaptivePolicy) else None


def _mode(policy: object) -> str | None:
    """The policy's mode as ``GET /admin/state`` names it (None for a policy without one)."""
    regime = _regime(policy)
    if regime is None:
        return None
    return "speculating" if regime[0] else "fallback"
