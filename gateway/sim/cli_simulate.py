"""``specgate simulate``: QPS × policy sweep of the routing core against the engine model.

Socket-free and in virtual time: a 120-second run at 32 QPS takes seconds to a minute of
CPU. Every (QPS, policy) point sees the same arrivals and the same requests (paired
comparison). Writes ``results.csv``, ``results.json``, ``results.md`` and ``results.png``
under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from gateway.bench.schedule import parse_schedule
from gateway.sim.report import markdown as md_table
from gateway.sim.report import plot, schedule_markdown, timeline_plot, write_csv, write_json
from gateway.sim.run import SimConfig, phase_summaries, simulate

POLICIES = ("adaptive", "always-spec", "always-base", "temperature")
RAMP_STEP_S = 5.0  # a ramp is simulated as constant-rate steps of at most this length


def sim_phases(spec: str) -> tuple[tuple[float, float], ...]:
    """The shared schedule grammar (gateway/bench/schedule.py: constant stages, ramps,
    geometric steps) as (QPS, seconds) phases; ramps become short constant steps."""
    phases: list[tuple[float, float]] = []
    for st in parse_schedule(spec).stages:
        if not math.isfinite(st.duration_s):
            raise ValueError("every stage needs a duration in a simulation (QPS:SECONDS)")
        n = 1 if st.start_qps == st.end_qps else max(1, math.ceil(st.duration_s / RAMP_STEP_S))
        d = st.duration_s / n
        phases += [(round(st.qps_at((j + 0.5) * d), 4), d) for j in range(n)]
    if any(q <= 0 for q, _ in phases):
        raise ValueError("phases need QPS > 0")
    return tuple(phases)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter
    parser.add_argument("--qps", default="0.5,1,2,4,8,16,32", help="comma-separated arrival rates (req/s)")
    parser.add_argument(
        "--policies",
        default="adaptive,always-spec,always-base",
        help=f"comma-separated, of {', '.join(POLICIES)}",
    )
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of arrivals per point")
    parser.add_argument("--seed", type=int, default=1, help="workload and arrival seed")
    parser.add_argument(
        "--warmup",
        type=float,
        default=15.0,
        help="seconds at the start (engines idle) whose arrivals are simulated but not measured",
    )
    parser.add_argument(
        "--mix",
        default=None,
        help="workload kind mix, e.g. 'edit=0.4,summary=0.2,rag=0.1,chat=0.3' (corpus default)",
    )
    parser.add_argument("--temperature", default="uniform:0:1", help="temperature distribution spec")
    parser.add_argument("--profile", default="h200-qwen3-8b", help="step-time profile of both engines")
    parser.add_argument("--method", default="ngram", help="speculative method of the spec engine")
    parser.add_argument("-k", "--num-speculative-tokens", dest="k", type=int, default=5)
    parser.add_argument(
        "--prompt-lookup-min",
        type=int,
        default=5,
        help="n-gram proposer's smallest match (ngram only; vLLM's default; the emulated pair uses 2)",
    )
    parser.add_argument(
        "--prompt-lookup-max", type=int, default=5, help="n-gram proposer's largest match (ngram only)"
    )
    parser.add_argument(
        "--routing", default="{}", help="JSON object of extra routing config fields for the adaptive policy"
    )
    parser.add_argument(
        "--schedule",
        default=None,
        help="time-varying load instead of a sweep, in the bench/Locust schedule grammar: 'QPS:SECONDS' "
        "stages, 'ramp:A-B:SECONDS' linear ramps (simulated as 5-s steps), 'steps:A-B:NxSECONDS'; e.g. "
        "'ramp:0.5-32:300,32:60,ramp:32-0.5:300'; each policy runs the whole schedule once "
        "(writes schedule.{csv,md,png})",
    )
    parser.add_argument("--jobs", type=int, default=1, help="points simulated in parallel (processes)")
    parser.add_argument("--out", type=Path, default=Path("results/sim"), help="output directory")


def _point(cfg: SimConfig) -> dict[str, float | int | str]:
    return simulate(cfg).summary()


def _sim_config(
    args: argparse.Namespace,
    qps: float,
    policy: str,
    duration_s: float,
    routing: dict[str, object],
    schedule: tuple[tuple[float, float], ...] = (),
) -> SimConfig:
    """One run's config from the command line (``routing`` only for the adaptive policy)."""
    return SimConfig(
        qps=qps,
        policy=policy,
        duration_s=duration_s,
        seed=args.seed,
        mix=args.mix,
        temperature=args.temperature,
        profile=args.profile,
        method=args.method,
        k=args.k,
        prompt_lookup_min=args.prompt_lookup_min,
        prompt_lookup_max=args.prompt_lookup_max,
        routing=routing if policy == "adaptive" else {},
        schedule=schedule,
        warmup_s=args.warmup,
    )


def run_schedule(
    args: argparse.Namespace,
    policies: list[str],
    phases: tuple[tuple[float, float], ...],
    routing: dict[str, object],
) -> int:
    rows: list[dict[str, float | int | str]] = []
    results = []
    for p in policies:
        cfg = _sim_config(args, phases[0][0], p, sum(d for _, d in phases), routing, schedule=phases)
        res = simulate(cfg)
        results.append(res)
        total = res.summary()
        total["qps"] = "all"
        total["phase_start_s"] = "all"
        rows.extend([*phase_summaries(res), total])
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    write_csv(rows, out / "schedule.csv", extra=("phase_start_s",))
    table = schedule_markdown(rows)
    (out / "schedule.md").write_text(table)
    timeline_plot(results, out / "schedule.png", f"specgate simulate — schedule {args.schedule}")
    print(table)
    print(f"wrote {out}/schedule.{{csv,md,png}}")
    return 0


def main(args: argparse.Namespace) -> int:
    try:
        qps = [float(x) for x in str(args.qps).split(",") if x.strip()]
        routing = json.loads(args.routing)
        if not isinstance(routing, dict):
            raise ValueError("--routing must be a JSON object")
    except ValueError as exc:
        print(f"specgate simulate: {exc}", file=sys.stderr)
        return 2
    policies = [p.strip() for p in str(args.policies).split(",") if p.strip()]
    if args.schedule:
        try:
            phases = sim_phases(str(args.schedule))
        except ValueError as exc:
            print(f"specgate simulate: bad --schedule: {exc}", file=sys.stderr)
            return 2
        return run_schedule(args, policies, phases, routing)
    bad = [p for p in policies if p not in POLICIES]
    if bad or not qps or any(q <= 0 for q in qps) or args.duration <= 0:
        print(f"specgate simulate: bad --policies {bad} or --qps/--duration", file=sys.stderr)
        return 2
    cfgs = [_sim_config(args, q, p, args.duration, routing) for q in qps for p in policies]
    t0 = time.monotonic()

    def progress(r: dict[str, float | int | str]) -> None:
        print(
            f"qps {float(r['qps']):>6g} {r['policy']!s:<12} TPOT mean {float(r['mean_tpot_ms']):6.2f} ms "
            f"p99 {float(r['p99_tpot_ms']):6.2f} ms  spec {float(r['spec_share']):.2f}",
            flush=True,
        )

    rows: list[dict[str, float | int | str]] = []
    if args.jobs > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            for fut in as_completed([pool.submit(_point, c) for c in cfgs]):
                rows.append(fut.result())
                progress(rows[-1])
        rows.sort(key=lambda r: (float(r["qps"]), str(r["policy"])))
    else:
        for c in cfgs:
            rows.append(_point(c))
            progress(rows[-1])
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "command": "specgate simulate " + " ".join(sys.argv[2:]),
        "duration_s": args.duration,
        "seed": args.seed,
        "mix": args.mix or "corpus default",
        "temperature": args.temperature,
        "profile": args.profile,
        "method": args.method,
        "k": args.k,
        "routing": routing,
        "warmup_s": args.warmup,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    write_csv(rows, out / "results.csv")
    write_json(rows, meta, out / "results.json")
    table = md_table(rows)
    (out / "results.md").write_text(table)
    plot(rows, out / "results.png", f"specgate simulate — {args.profile}, {args.method} k={args.k}")
    print(table)
    print(f"wrote {out}/results.{{csv,json,md,png}} in {meta['wall_s']} s")
    return 0
