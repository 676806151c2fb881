"""The fleet's target grid (issue 53), from the simulator: placement against the static
fleets and the offline oracle, and the decision cost at 64 pairs.

    PYTHONPATH=. python3 loadtests/fleet_matrix.py --jobs 16 --out results/sim/fleet      # the grid
    PYTHONPATH=. python3 loadtests/fleet_matrix.py --list                                 # its cells
    PYTHONPATH=. python3 loadtests/fleet_matrix.py --only 'p4/corpus/lk2/s1/' --duration 40 --jobs 1
    PYTHONPATH=.:lab python3 loadtests/fleet_matrix.py --decision-cost 64                 # µs/request

Cells: 4 and 16 pairs × three mixes (the corpus's, a copy-heavier and a chat-heavier one) ×
n-gram lookup 2..5 and 5..5 × seeds 1-3 × 25/50/75/90 % of the fleet's capacity (pairs ×
``--capacity`` req/s, one pair's capacity under the better static). Every run of a cell sees
the same arrivals; each is one job: adaptive, the two static fleets (every pair in one
regime, the least-loaded pair) and each candidate of the oracle's search
(:mod:`specgate_lab.sim.oracle`; its classes ordered by what the static fleets measured). A
cell gives adaptive ÷ the best static (mean and p99 TPOT) and ÷ the oracle, and whether the
classes differ in what speculation buys there (the oracle is ≥ 5 % ahead of the best
static). Targets: mean ≤ 1.01 × best static everywhere, ≤ 0.95 ×
where the classes differ, ≤ 1.02 × oracle, p99 ≤ 1.05 × the best static's; a miss is
printed, and the exit status is then 1. Written under ``--out``: ``fleet.json`` and
``fleet.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specgate_lab.sim.fleet import simulate_fleet
from specgate_lab.sim.oracle import best_of, by_measured_gain, candidates, kind_tpot
from specgate_lab.sim.records import SimConfig

MIXES = {
    "corpus": None,
    "copy": "edit=0.6,summary=0.2,rag=0.1,chat=0.1",
    "chat": "edit=0.15,summary=0.15,rag=0.1,chat=0.6",
}
LOOKUPS = {"lk2": (2, 5), "lk5": (5, 5)}
LOADS = (0.25, 0.5, 0.75, 0.9)
PAIRS = (4, 16)
SEEDS = (1, 2, 3)
# One pair's capacity (req/s) under the better static (always-base), per lookup: the corpus
# mix, answers up to 1,024 tokens; one pair at 42 req/s still answers in 23 ms (TTFT), at 50
# its queue grows (TTFT 3.7 s): `specgate simulate --qps 30,36,42,50 --duration 25`.
CAPACITY = {"lk2": 45.0, "lk5": 45.0}
TARGETS = {"mean_vs_static": 1.01, "mean_where_classes_differ": 0.95, "mean_vs_oracle": 1.02, "p99": 1.05}
STATICS = ("always-spec", "always-base")
DIFFER = 0.95  # the oracle this far ahead of the best static: the classes differ


@dataclass(frozen=True)
class Cell:
    name: str  # e.g. "p4/corpus/lk2/s1/50"
    cfg: SimConfig  # the adaptive run's config


def cells(duration: float, capacity: dict[str, float]) -> list[Cell]:
    out = []
    for n in PAIRS:
        for mix_name, mix in MIXES.items():
            for lk, (lo, hi) in LOOKUPS.items():
                for seed in SEEDS:
                    for load in LOADS:
                        cfg = SimConfig(
                            qps=round(load * n * capacity[lk], 2),
                            duration_s=duration,
                            seed=seed,
                            mix=mix,
                            prompt_lookup_min=lo,
                            prompt_lookup_max=hi,
                            pairs=n,
                        )
                        out.append(Cell(f"p{n}/{mix_name}/{lk}/s{seed}/{round(load * 100)}", cfg))
    return out


def command(cfg: SimConfig) -> str:
    mix = f" --mix {cfg.mix}" if cfg.mix else ""
    return (
        f"specgate simulate --pairs {cfg.pairs} --qps {cfg.qps:g} --duration {cfg.duration_s:g} "
        f"--seed {cfg.seed}{mix} --prompt-lookup-min {cfg.prompt_lookup_min} "
        f"--prompt-lookup-max {cfg.prompt_lookup_max} --oracle"
    )


def first_runs(cell: Cell) -> list[SimConfig]:
    """The cell's first runs: adaptive and the static fleets (whose per-kind times order the
    oracle's candidates, :func:`oracle_runs`)."""
    return [replace(cell.cfg, policy=p) for p in ("adaptive", "always-spec", "always-base")]


def oracle_runs(cell: Cell, spec: dict[str, float], base: dict[str, float]) -> list[SimConfig]:
    """The oracle's candidates beyond the two static fleets (:mod:`specgate_lab.sim.oracle`)."""
    order = by_measured_gain(spec, base, sorted(set(spec) | set(base)))
    return [replace(cell.cfg, policy=p) for p in candidates(order, cell.cfg.pairs)[2:]]


def run_one(key: tuple[str, SimConfig]) -> tuple[str, dict[str, Any], float]:
    t0 = time.process_time()
    result = simulate_fleet(key[1])
    row: dict[str, Any] = {**result.summary(), "policy": key[1].policy, "kinds": kind_tpot(result)}
    return key[0], row, time.process_time() - t0


def judge(rows: list[dict[str, Any]]) -> dict[str, float | bool]:
    by = {str(r["policy"]): r for r in rows}
    ad = by["adaptive"]
    static = min((by[p] for p in ("always-spec", "always-base")), key=lambda r: float(r["mean_tpot_ms"]))
    fixed = ("always-spec", "always-base")  # the oracle's two static candidates
    oracle = best_of([r for r in rows if str(r["policy"]).startswith("assign:") or r["policy"] in fixed])
    mean = float(ad["mean_tpot_ms"])
    out: dict[str, float | bool] = {
        "adaptive_ms": mean,
        "best_static_ms": float(static["mean_tpot_ms"]),
        "oracle_ms": float(oracle["mean_tpot_ms"]),
        "vs_static": mean / float(static["mean_tpot_ms"]),
        "vs_oracle": mean / float(oracle["mean_tpot_ms"]),
        "p99_vs_static": float(ad["p99_tpot_ms"]) / float(static["p99_tpot_ms"]),
        "spec_share": float(ad["spec_share"]),
    }
    out["classes_differ"] = float(oracle["mean_tpot_ms"]) / float(static["mean_tpot_ms"]) <= DIFFER
    return out


def misses(name: str, j: dict[str, float | bool]) -> list[str]:
    out = []
    if j["vs_static"] > TARGETS["mean_vs_static"]:
        out.append(f"{name}: mean {j['vs_static']:.3f} × best static")
    if j["classes_differ"] and j["vs_static"] > TARGETS["mean_where_classes_differ"]:
        out.append(f"{name}: classes differ, mean {j['vs_static']:.3f} × best static")
    if j["vs_oracle"] > TARGETS["mean_vs_oracle"]:
        out.append(f"{name}: mean {j['vs_oracle']:.3f} × oracle")
    if j["p99_vs_static"] > TARGETS["p99"]:
        out.append(f"{name}: p99 {j['p99_vs_static']:.3f} × best static's")
    return out


def decision_cost(pairs: int) -> int:
    """Print µs per decision of the fleet policy over ``pairs`` simulated pairs, as
    :mod:`decision_cost` measures it with its defaults; its exit status."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from decision_cost import main as measure

    return measure(["--pairs", str(pairs)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--duration", type=float, default=120.0, help="seconds of arrivals per run")
    ap.add_argument("--only", default="", help="cells whose name starts with this (comma-separated)")
    ap.add_argument("--list", action="store_true", help="print the cells and their commands")
    ap.add_argument("--capacity", type=float, default=None, help="one pair's req/s (default per lookup)")
    ap.add_argument("--decision-cost", type=int, default=None, metavar="PAIRS")
    ap.add_argument("--out", type=Path, default=Path("results/sim/fleet"))
    args = ap.parse_args(argv)
    if args.decision_cost:
        return decision_cost(args.decision_cost)
    cap = {k: args.capacity or v for k, v in CAPACITY.items()}
    prefixes = [p for p in args.only.split(",") if p]
    todo = [c for c in cells(args.duration, cap) if not prefixes or c.name.startswith(tuple(prefixes))]
    if args.list:
        for c in todo:
            print(f"{c.name}: {command(c.cfg)}")
        return 0
    rows: dict[str, list[dict[str, Any]]] = {c.name: [] for c in todo}
    by_name = {c.name: c for c in todo}
    cpu = 0.0
    t0 = time.monotonic()
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        pending = {pool.submit(run_one, (c.name, r)) for c in todo for r in first_runs(c)}
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                name, row, s = fut.result()
                rows[name].append(row)
                cpu += s
                print(f"{name} {row['policy']}: {float(row['mean_tpot_ms']):.3f} ms", flush=True)
                statics = {str(r["policy"]): r["kinds"] for r in rows[name] if r["policy"] in STATICS}
                if row["policy"] in STATICS and len(statics) == 2:  # the oracle's search, ordered
                    more = oracle_runs(by_name[name], statics["always-spec"], statics["always-base"])
                    pending |= {pool.submit(run_one, (name, r)) for r in more}
    result = {c.name: {"command": command(c.cfg), **judge(rows[c.name])} for c in todo}
    missed = [m for name, j in result.items() for m in misses(name, j)]  # type: ignore[arg-type]
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {
        "duration_s": args.duration,
        "capacity": cap,
        "cpu_s": round(cpu),
        "wall_s": round(time.monotonic() - t0),
    }
    (args.out / "fleet.json").write_text(
        json.dumps({"meta": meta, "cells": result, "misses": missed}, indent=1)
    )
    head = (
        "| cell | ÷ best static | ÷ oracle | p99 ÷ best static | classes differ | spec share |\n"
        "|---|---|---|---|---|---|\n"
    )
    lines = [
        f"| {n} | {j['vs_static']:.3f} | {j['vs_oracle']:.3f} | {j['p99_vs_static']:.3f} | "
        f"{'yes' if j['classes_differ'] else 'no'} | {j['spec_share']:.2f} |"
        for n, j in result.items()
    ]
    worst = max((float(j["vs_static"]) for j in result.values()), default=math.nan)
    table = head + "\n".join(lines) + f"\n\nworst ÷ best static: {worst:.3f}; misses: {len(missed)}\n"
    (args.out / "fleet.md").write_text(table)
    print(table)
    for m in missed:
        print("MISS", m)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
