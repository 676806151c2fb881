"""What a ``specgate simulate`` command line asks for, as run configs: the flags checked, a
named scenario's engine pair merged under them (a flag given explicitly wins), one
:class:`~specgate_lab.sim.records.SimConfig` per run. The CLI and ``loadtests/routing_matrix.py``
build their runs through :func:`plan`, so a matrix cell is exactly its command line."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace

from gateway.routing.factory import ADAPTIVE, POLICY_NAMES, STATIC_BASELINES
from specgate_lab.emulator.engine_types import SLOPE_MAX, check_spec_cost_scale
from specgate_lab.emulator.spec import parse_spec_config
from specgate_lab.sim.fleet import ONE_REGIME
from specgate_lab.sim.records import SimConfig
from specgate_lab.sim.run import DYNAMIC_SD
from specgate_lab.sim.scenarios import Pair, Phase, Scenario, from_schedule, get_scenario

POLICIES = (*POLICY_NAMES, DYNAMIC_SD, ONE_REGIME)
DEFAULT_POLICIES = (ADAPTIVE, *STATIC_BASELINES)
# The engine-pair flags a scenario may set (Pair's fields; argparse leaves them None when not
# given), and their defaults where neither the command line nor the scenario sets them.
PAIR_DEFAULTS: dict[str, object] = {
    "method": "ngram",
    "k": 5,
    "spec_config": "{}",
    "max_num_seqs": 256,
    "spec_cost_scale": 1.0,
    "spec_cost_slope": 0.0,
    "device_scale": 1.0,
    "device_scale_slope": 0.0,
}


@dataclass(frozen=True)
class Plan:
    args: argparse.Namespace  # the command line with the engine pair resolved
    scenario: Scenario | None  # a named scenario or a --schedule; None: a QPS sweep
    seeds: list[int]
    configs: list[SimConfig]


def with_pair(args: argparse.Namespace, pair: Pair | None = None) -> argparse.Namespace:
    """A copy of ``args`` where each engine-pair flag not given (None) is the scenario's
    ``pair`` value, else its default."""
    out = argparse.Namespace(**vars(args))
    for name, default in PAIR_DEFAULTS.items():
        if getattr(args, name, None) is None:
            value = None if pair is None else getattr(pair, name)
            setattr(out, name, default if value is None else value)
    return out


def check(args: argparse.Namespace) -> None:
    """ValueError naming the first bad flag of a resolved command line."""
    extra = json.loads(args.spec_config)
    if not isinstance(extra, dict):
        raise ValueError("--spec-config must be a JSON object")
    parse_spec_config({"method": args.method, "num_speculative_tokens": args.k, **extra})
    if not isinstance(json.loads(args.routing), dict):
        raise ValueError("--routing must be a JSON object")
    if not 1 <= args.max_num_seqs <= 4096:
        raise ValueError("--max-num-seqs must be 1..4096")
    if not 1 <= args.max_tokens_cap <= 32768:
        raise ValueError("--max-tokens-cap must be 1..32768")
    if not 0.0 <= args.spec_overhead_ms <= 1000.0:
        raise ValueError("--spec-overhead-ms must be within 0..1000")
    check_spec_cost_scale(args.spec_cost_scale, "--spec-cost-scale")
    check_spec_cost_scale(args.device_scale, "--device-scale")
    for flag in ("--spec-cost-slope", "--device-scale-slope"):
        if not -SLOPE_MAX <= getattr(args, flag[2:].replace("-", "_")) <= SLOPE_MAX:
            raise ValueError(f"{flag} must be within ±{SLOPE_MAX:g}")
    if args.dynamic_sd_max_batch < 1:
        raise ValueError("--dynamic-sd-max-batch must be >= 1")
    if args.replicas is not None and not 1 <= args.replicas <= 64:
        raise ValueError("--replicas must be 1..64")
    pairs = getattr(args, "pairs", 1)
    if not 1 <= pairs <= 256:
        raise ValueError("--pairs must be 1..256")
    if pairs > 1 and (args.replicas or 1) > 1:
        raise ValueError("--pairs and --replicas: one gateway replica in front of a fleet")
    pair_events(getattr(args, "pair_events", None))


def pair_events(spec: str | None) -> tuple[tuple[float, int], ...]:
    """``--pair-events 'SECONDS:-1,SECONDS:+1'``: a pair lost or added at those times."""
    out = []
    for item in (spec or "").split(","):
        if not item.strip():
            continue
        t, _, d = item.partition(":")
        try:
            at, delta = float(t), int(d)
        except ValueError:
            raise ValueError(f"bad --pair-events item {item!r} (SECONDS:-1 or SECONDS:+1)") from None
        if delta not in (-1, 1) or at < 0:
            raise ValueError(f"bad --pair-events item {item!r} (SECONDS:-1 or SECONDS:+1)")
        out.append((at, delta))
    return tuple(out)


def sim_config(
    args: argparse.Namespace,
    qps: float,
    policy: str,
    duration_s: float,
    phases: tuple[Phase, ...] = (),
    seed: int | None = None,
) -> SimConfig:
    """One run's config from a command line (``--routing`` only for the adaptive policy)."""
    args = with_pair(args)
    return SimConfig(
        qps=qps,
        policy=policy,
        duration_s=duration_s,
        seed=args.seed if seed is None else seed,
        mix=args.mix,
        temperature=args.temperature,
        profile=args.profile,
        method=args.method,
        k=args.k,
        prompt_lookup_min=args.prompt_lookup_min,
        prompt_lookup_max=args.prompt_lookup_max,
        spec_cost_scale=args.spec_cost_scale,
        device_scale=args.device_scale,
        spec_cost_slope=args.spec_cost_slope,
        device_scale_slope=args.device_scale_slope,
        spec_extra=json.loads(args.spec_config),
        spec_overhead_ms=args.spec_overhead_ms,
        max_num_seqs=args.max_num_seqs,
        max_tokens_cap=args.max_tokens_cap,
        routing=json.loads(args.routing) if policy == ADAPTIVE else {},
        phases=phases,
        warmup_s=args.warmup,
        replicas=args.replicas or 1,
        replicas_reported=args.replicas is not None,
        peers=args.peers,
        peer_lag_s=args.peer_lag_ms / 1000.0,
        dynamic_k=((1, args.dynamic_sd_max_batch, args.k), (args.dynamic_sd_max_batch + 1, 1 << 20, 0)),
        pairs=getattr(args, "pairs", 1) or 1,
        pair_events=pair_events(getattr(args, "pair_events", None)),
    )


def plan(args: argparse.Namespace) -> Plan:
    """The runs a command line asks for (not ``--scenario list``); ValueError if it is bad."""
    if args.scenario and args.schedule:
        raise ValueError("give --scenario or --schedule, not both")
    sc = None
    if args.scenario:
        sc = get_scenario(args.scenario)
    elif args.schedule:
        sc = from_schedule(str(args.schedule))
    args = with_pair(args, None if sc is None else sc.pair)
    qps = [float(x) for x in str(args.qps).split(",") if x.strip()]
    check(args)
    default = ",".join(DEFAULT_POLICIES) + (f",{DYNAMIC_SD}" if sc else "")
    policies = [p.strip() for p in str(args.policies or default).split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES]
    if sc is not None:
        sc = sc.scaled(args.time_scale)
        n = getattr(args, "pairs", 1) or 1
        if n > 1:  # a fleet: each pair sees about the scenario's load (the total is n times it)
            sc = replace(
                sc,
                phases=tuple(replace(p, start_qps=p.start_qps * n, end_qps=p.end_qps * n) for p in sc.phases),
                description=f"{sc.description} (× {n} pairs)",
            )
        if bad or not policies:
            raise ValueError(f"bad --policies {bad}")
        q0, span = sc.phases[0].start_qps, sc.duration_s
        return Plan(args, sc, [args.seed], [sim_config(args, q0, p, span, sc.phases) for p in policies])
    try:
        seeds = [int(x) for x in str(args.seeds).split(",") if x.strip()] if args.seeds else [args.seed]
    except ValueError:
        raise ValueError(f"bad --seeds {args.seeds!r}") from None
    if bad or not qps or any(q <= 0 for q in qps) or args.duration <= 0:
        raise ValueError(f"bad --policies {bad} or --qps/--duration")
    cfgs = [sim_config(args, q, p, args.duration, seed=sd) for sd in seeds for q in qps for p in policies]
    return Plan(args, None, seeds, cfgs)
