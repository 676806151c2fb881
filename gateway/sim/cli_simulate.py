"""``specgate simulate``: QPS × policy sweep of the routing core against the engine model.

Socket-free and in virtual time: a 120-second run at 32 QPS takes seconds to a minute of
CPU. Every (QPS, policy) point sees the same arrivals and the same requests (paired
comparison). Writes ``results.csv``, ``results.json``, ``results.md`` and ``results.png``
under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from gateway.sim.report import markdown as md_table
from gateway.sim.report import plot, write_csv, write_json
from gateway.sim.run import SimConfig, simulate

POLICIES = ("adaptive", "always-spec", "always-base", "temperature")


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
        "--mix",
        default=None,
        help="workload kind mix, e.g. 'edit=0.4,summary=0.2,rag=0.1,chat=0.3' (corpus default)",
    )
    parser.add_argument("--temperature", default="uniform:0:1", help="temperature distribution spec")
    parser.add_argument("--profile", default="h200-qwen3-8b", help="step-time profile of both engines")
    parser.add_argument("--method", default="ngram", help="speculative method of the spec engine")
    parser.add_argument("-k", "--num-speculative-tokens", dest="k", type=int, default=5)
    parser.add_argument(
        "--routing", default="{}", help="JSON object of extra routing config fields for the adaptive policy"
    )
    parser.add_argument("--jobs", type=int, default=1, help="points simulated in parallel (processes)")
    parser.add_argument("--out", type=Path, default=Path("results/sim"), help="output directory")


def _point(cfg: SimConfig) -> dict[str, float | int | str]:
    return simulate(cfg).summary()


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
    bad = [p for p in policies if p not in POLICIES]
    if bad or not qps or any(q <= 0 for q in qps) or args.duration <= 0:
        print(f"specgate simulate: bad --policies {bad} or --qps/--duration", file=sys.stderr)
        return 2
    cfgs = [
        SimConfig(
            qps=q,
            policy=p,
            duration_s=args.duration,
            seed=args.seed,
            mix=args.mix,
            temperature=args.temperature,
            profile=args.profile,
            method=args.method,
            k=args.k,
            routing=routing if p == "adaptive" else {},
        )
        for q in qps
        for p in policies
    ]
    t0 = time.monotonic()
    if args.jobs > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            rows = list(pool.map(_point, cfgs))
    else:
        rows = []
        for c in cfgs:
            rows.append(_point(c))
            r = rows[-1]
            print(
                f"qps {c.qps:>6g} {c.policy:<12} TPOT mean {float(r['mean_tpot_ms']):6.2f} ms "
                f"p99 {float(r['p99_tpot_ms']):6.2f} ms  spec {float(r['spec_share']):.2f}",
                flush=True,
            )
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
