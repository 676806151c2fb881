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
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path

from gateway.routing.names import ADAPTIVE
from specgate_lab.sim.cli_scenario import run_scenario
from specgate_lab.sim.fleet import ONE_REGIME, join_delays, simulate_any
from specgate_lab.sim.oracle import search as oracle_search
from specgate_lab.sim.plan import DEFAULT_POLICIES, PAIR_DEFAULTS, POLICIES, plan
from specgate_lab.sim.records import SimConfig
from specgate_lab.sim.report import markdown as md_table
from specgate_lab.sim.report import plot, seed_ratios, write_csv, write_json
from specgate_lab.sim.run import DYNAMIC_SD
from specgate_lab.sim.scenarios import describe_all

__all__ = ["DEFAULT_POLICIES", "POLICIES", "configure", "main"]

ORACLE = "oracle"  # a row of --oracle: the best fixed assignment of classes to pairs


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a flag's default unless it is None (then its help says what applies)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        return action.help if action.default is None else super()._get_help_string(action)


def _pair(name: str) -> str:
    """The help's note for an engine-pair flag (its default; a named scenario may set it)."""
    return f" (default: {PAIR_DEFAULTS[name]}, or the scenario's; given here, it overrides the scenario's)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = _Help
    parser.add_argument("--qps", default="0.5,1,2,4,8,16,32", help="comma-separated arrival rates (req/s)")
    parser.add_argument(
        "--policies",
        default=None,
        help=f"comma-separated, of {', '.join(POLICIES)} (default: adaptive and the two statics; a "
        f"scenario adds {DYNAMIC_SD}: one engine alone with vLLM's Dynamic SD, K=k up to batch 32 "
        "then K=0, as a baseline)",
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
    parser.add_argument(
        "--method", default=None, help="the spec engine's speculative method" + _pair("method")
    )
    parser.add_argument(
        "-k", "--num-speculative-tokens", dest="k", type=int, default=None, help="k" + _pair("k")
    )
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
        "--dynamic-sd-max-batch",
        type=int,
        default=32,
        help=f"{DYNAMIC_SD}: speculate with K=k up to this many running requests, K=0 above",
    )
    parser.add_argument(
        "--spec-config",
        default=None,
        help="JSON object of more speculative-config keys for the spec engine, as vLLM takes them, "
        "merged over --method and -k (e.g. synthetic acceptance: "
        '\'{"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.4, 0.15, 0.05]}\')'
        + _pair("spec_config"),
    )
    parser.add_argument(
        "--max-num-seqs", type=int, default=None, help="both engines' max_num_seqs" + _pair("max_num_seqs")
    )
    parser.add_argument(
        "--max-tokens-cap",
        type=int,
        default=1024,
        help="each request's max_tokens at most this (the real-GPU scripts send 256)",
    )
    parser.add_argument(
        "--spec-cost-scale",
        type=float,
        default=None,
        help="the simulated spec engine's truth: what speculation adds to a step (verifying drafts, "
        "drafting) as a multiple of the profile the router assumes; e.g. 0.5 (cheaper than the "
        "router's prior) or 1.5 (dearer) to check that routing follows measured latency, not the model"
        + _pair("spec_cost_scale"),
    )
    parser.add_argument(
        "--device-scale",
        type=float,
        default=None,
        help="the simulated device's truth: both engines' step times as a multiple of the profile the "
        "router assumes (e.g. 1.5: a slower GPU than the profile's), to check that an error common to "
        "both engines does not count against the one that runs" + _pair("device_scale"),
    )
    parser.add_argument(
        "--spec-cost-slope",
        type=float,
        default=None,
        help="how --spec-cost-scale changes with the batch: times (batch / 8) ** this; e.g. -0.8 for "
        "a drafter whose excess over the profile shrinks at large batches (a real H100, round 16)"
        + _pair("spec_cost_slope"),
    )
    parser.add_argument(
        "--device-scale-slope",
        type=float,
        default=None,
        help="how --device-scale changes with the batch: times (batch / 8) ** this; e.g. 0.18 for a "
        "device that falls behind the profile as the batch grows (a real H100, round 16)"
        + _pair("device_scale_slope"),
    )
    parser.add_argument(
        "--spec-overhead-ms",
        type=float,
        default=0.0,
        help="the simulated spec engine's truth: host time every one of its steps takes beyond the "
        "profile's (a fixed cost weighs most on small batches)",
    )
    parser.add_argument(
        "--routing", default="{}", help="JSON object of extra routing config fields for the adaptive policy"
    )
    parser.add_argument(
        "--schedule",
        default=None,
        help="time-varying load instead of a sweep, in the shared schedule grammar: 'QPS:SECONDS' steps, "
        "'ramp:A-B:SECONDS' ramps, 'steps:A-B:NxSECONDS', e.g. 'ramp:0.5-32:300,32:60,ramp:32-0.5:300'; "
        "each policy runs it once (a scenario report, as --scenario)",
    )
    parser.add_argument(
        "--scenario",
        default=None,
        help="a named scenario (load, mix and temperature over time); 'list' prints them",
    )
    parser.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="scenario/schedule phases last this many times as long (e.g. 0.05 for a quick check)",
    )
    parser.add_argument(
        "--seeds",
        default=None,
        help="comma-separated seeds for the sweep (overrides --seed): per-seed ratios",
    )
    parser.add_argument("--slo-tpot-ms", type=float, default=20.0, help="goodput: TPOT SLO (ms)")
    parser.add_argument("--slo-ttft-ms", type=float, default=1000.0, help="goodput: TTFT SLO (ms)")
    parser.add_argument(
        "--switch-margin",
        type=float,
        default=0.02,
        help="time to switch: a minute's better static counts when it is better by at least this fraction",
    )
    parser.add_argument("--jobs", type=int, default=1, help="runs simulated in parallel (processes)")
    parser.add_argument(
        "--replicas",
        type=int,
        default=None,
        help="gateway replicas in front of the pair (default 1), taking arrivals in turn, each with its own "
        "policy; when given, results.json has each run's share of time the replicas' modes differed and "
        "both engines ran requests",
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="join the replicas by the peer channel (routing.peers): each hears the others' requests, "
        "outcomes and the leader's regime after --peer-lag-ms",
    )
    parser.add_argument(
        "--peer-lag-ms", type=float, default=2.0, help="the peer channel's delivery delay (default 2 ms)"
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=1,
        help="a fleet: this many pairs, each on its own device, behind one gateway (--qps is the total); "
        f"policies then include {ONE_REGIME} (one regime for all pairs, the least-loaded pair)",
    )
    parser.add_argument(
        "--pair-events",
        default=None,
        help="pairs lost or added mid-run, e.g. '60:-1,90:+1' (a pair dies at 60 s, one joins at 90 s)",
    )
    parser.add_argument(
        "--oracle",
        action="store_true",
        help="with --pairs: add the offline oracle per point (the best fixed assignment of classes to "
        "pairs, by search over simulated runs)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default results/sim, or results/sim/scenarios/NAME for a scenario)",
    )


def _point(cfg: SimConfig) -> dict[str, float | int | str]:
    if cfg.policy == ORACLE:
        row, _ = oracle_search(replace(cfg, policy=ADAPTIVE))
        row["seed"] = cfg.seed
        return row
    result = simulate_any(cfg)
    row = result.summary()
    row["seed"] = cfg.seed
    if cfg.pairs > 1:
        row["pairs"] = cfg.pairs
    if cfg.pair_events:  # a pair lost or added: what failed, how soon a new pair served
        row["unfinished"] = int(row["requests"]) - int(row["finished"])
        row["join_serving_s"] = max(join_delays(result), default=0.0)
    if cfg.replicas_reported:
        row["replicas"] = cfg.replicas
        row.update(result.replica_summary())
    return row


def main(args: argparse.Namespace) -> int:
    if args.scenario == "list":
        print(describe_all())
        return 0
    try:
        p = plan(args)
    except ValueError as exc:
        print(f"specgate simulate: {exc}", file=sys.stderr)
        return 2
    if p.scenario is not None:
        return run_scenario(p.args, p.scenario, p.configs)
    args, seeds, cfgs = p.args, p.seeds, p.configs
    if args.oracle:
        cfgs = cfgs + [replace(c, policy=ORACLE) for c in cfgs if c.policy == ADAPTIVE]
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
        rows.sort(key=lambda r: (int(r["seed"]), float(r["qps"]), str(r["policy"])))
    else:
        for c in cfgs:
            rows.append(_point(c))
            progress(rows[-1])
    out: Path = args.out or Path("results/sim")
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "command": "specgate simulate " + " ".join(sys.argv[2:]),
        "duration_s": args.duration,
        "seeds": seeds,
        "mix": args.mix or "corpus default",
        "temperature": args.temperature,
        "profile": args.profile,
        "method": args.method,
        "k": args.k,
        "routing": json.loads(args.routing),
        "warmup_s": args.warmup,
        "wall_s": round(time.monotonic() - t0, 1),
    }
    write_csv(rows, out / "results.csv", extra=("seed",))
    write_json(rows, meta, out / "results.json")
    table = md_table([r for r in rows if r["seed"] == seeds[0]])
    if len(seeds) > 1:
        table += "\n" + seed_ratios(rows)
    (out / "results.md").write_text(table)
    drawn = plot(
        [r for r in rows if r["seed"] == seeds[0]],
        out / "results.png",
        f"specgate simulate — {args.profile}, {args.method} k={args.k}",
    )
    print(table)
    print(f"wrote {out}/results.{{csv,json,md{',png' if drawn else ''}}} in {meta['wall_s']} s")
    return 0
