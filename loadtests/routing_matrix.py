"""The scenario matrix that judges the routing core (issue 52's "Must hold"), from the simulator.

    PYTHONPATH=. python3 loadtests/routing_matrix.py --jobs 16 --out results/sim/matrix
    PYTHONPATH=. python3 loadtests/routing_matrix.py --jobs 16 --out DIR --floor FLOOR/matrix.json
    PYTHONPATH=. python3 loadtests/routing_matrix.py --list            # the cells and their commands
    PYTHONPATH=. python3 loadtests/routing_matrix.py --quick --only eagle3 --jobs 2 --out /tmp/q

Every cell is a ``specgate simulate`` command line (built through :mod:`specgate_lab.sim.plan`, so
the same arguments to ``specgate simulate`` reproduce it), run with adaptive and the two
statics on identical arrivals, socket-free. Cells: every committed scenario at seeds 1-3
(the EAGLE-3 family among them, group ``eagle3``); the stationary sweeps (lookup 5 and 2,
and copy-heavy); the device-scale runs; the simulated GPU days of rounds 17-19; the replica
runs (stationary and the load step), whose adaptive-only cells are compared with the one
replica cell they name (its statics, and its adaptive as "one replica"). Each cell gives
adaptive ÷ the best static and ÷ the other static (mean and p99 TPOT); scenarios add
÷ oracle, the share of the oracle's gain captured and the worst minute; replica cells the
share of time the replicas' modes differed.

Written under ``--out``: ``matrix.json`` (every figure, the runs' CPU seconds) and
``matrix.md``. With ``--floor`` (a ``matrix.json`` of the core to hold), a cell whose mean
TPOT ÷ best static exceeds its floor's × 1.01, or a missed target (:data:`TARGETS`), is
printed and the exit status is 1.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specgate_lab.sim import scenario_report
from specgate_lab.sim.agreement import switch_spread
from specgate_lab.sim.analysis import Slo
from specgate_lab.sim.cli_simulate import configure
from specgate_lab.sim.plan import Plan, plan
from specgate_lab.sim.records import RequestRecord, SimConfig
from specgate_lab.sim.run import simulate
from specgate_lab.sim.scenarios import SCENARIOS

STATICS = ("always-spec", "always-base")
ALL = "adaptive,always-spec,always-base"
SEEDS = (1, 2, 3)
FLOOR_TOLERANCE = 1.01  # a cell may read 1 % worse than its floor (mean TPOT ÷ best static)
E3_ARGS = (
    "--method", "eagle3", "-k", "3", "--max-num-seqs", "256", "--max-tokens-cap", "256",
    "--spec-config", '{"rejection_sample_method":"synthetic","synthetic_acceptance_rates":[0.4,0.15,0.05]}',
)  # fmt: skip
ROUND_DAYS = {  # the simulated GPU days of rounds 17-19 (docs/gpu-rounds.md), name: schedule and truth flags
    "round17": ("ramp:2-12:15,12:35,ramp:12-50:15,50:15,ramp:50-12:10,12:10", ()),
    "round17-like": (
        "ramp:2-12:15,12:35,ramp:12-50:15,50:15,ramp:50-12:10,12:10",
        ("--spec-cost-scale", "0.6", "--spec-cost-slope", "0.15"),
    ),
    "round18-like": (
        "ramp:2-10:30,10:70,ramp:10-32:30,32:30,ramp:32-10:20,10:20",
        ("--device-scale", "1.35", "--spec-cost-scale", "0.7"),
    ),
    "round19": ("ramp:2-12:20,12:50,ramp:12-44:25,44:25,ramp:44-12:20,12:20", ()),
    "round19-like": (
        "ramp:2-12:20,12:50,ramp:12-44:25,44:25,ramp:44-12:20,12:20",
        ("--spec-cost-scale", "0.6", "--spec-cost-slope", "0.15"),
    ),
}


@dataclass(frozen=True)
class Cell:
    name: str  # the key in matrix.json, e.g. "scenario/day32/s1"
    group: str
    argv: tuple[str, ...]  # specgate simulate's arguments
    ref: str | None = None  # the one-replica cell this one is compared with (its statics too)

    def plan(self) -> Plan:
        parser = argparse.ArgumentParser()
        configure(parser)
        return plan(parser.parse_args(list(self.argv)))


@dataclass(frozen=True)
class Target:
    cells: str  # a regular expression on cell names
    metric: str  # a key of a cell's figures
    bound: float
    upper: bool = True  # the figure must be <= bound (else >= bound)
    why: str = ""


TARGETS = (
    Target(r"^eagle3/", "vs_best_mean", 1.02, why="issue 52"),
    Target(r"^eagle3/", "vs_best_p99", 1.10, why="issue 52"),
    Target(r"^sweep/lookup[52]/", "vs_best_mean", 1.02, why="routing-results.md, stationary sweep"),
    Target(r"^scenario/(mix|temp)-shift/", "vs_oracle", 1.01, why="routing-results.md, shifts"),
    Target(r"^scenario/(mix|temp)-shift/", "captured", 0.90, upper=False, why="routing-results.md, shifts"),
    Target(r"^replicas/.*-peers$", "modes_differ", 0.001, why="routing-results.md, joined replicas agree"),
)


def cells(quick: bool = False) -> list[Cell]:
    """Every cell of the matrix; ``quick`` shortens every run (a smoke run, not a figure)."""
    scen = ("--time-scale", "0.1", "--warmup", "2") if quick else ()

    def dur(s: float) -> tuple[str, ...]:
        return ("--duration", f"{s / 10:g}", "--warmup", "2") if quick else ("--duration", f"{s:g}")

    out: list[Cell] = []
    for name, sc in SCENARIOS.items():
        group = "eagle3" if sc.pair.method == "eagle3" else "scenario"
        out += [
            Cell(f"{group}/{name}/s{s}", group, ("--scenario", name, "--seed", str(s), *scen)) for s in SEEDS
        ]
    sweeps = {
        "lookup5": ((0.5, 1, 2, 4, 8, 16, 32, 64), SEEDS, ()),
        "lookup2": ((0.5, 2, 6, 16, 32, 48), SEEDS, ("--prompt-lookup-min", "2")),
        "copy-heavy": ((0.5, 2, 8, 32, 64), (1,), ("--mix", "edit=1", "--temperature", "0")),
    }
    for sweep, (qps, seeds, extra) in sweeps.items():
        for s in seeds:
            for q in qps:
                argv = ("--qps", f"{q:g}", "--seed", str(s), *dur(120), *extra)
                out.append(Cell(f"sweep/{sweep}/q{q:g}/s{s}", "sweep", argv))
    for name in ("day48-copy", "mix-shift"):
        for scale in ("1.5", "2.0"):
            argv = ("--scenario", name, "--device-scale", scale, *scen)
            out.append(Cell(f"device-scale/{name}/{scale}", "device-scale", argv))
    for name, (schedule, truth) in ROUND_DAYS.items():
        argv = ("--schedule", schedule, *E3_ARGS, *truth, *scen)
        out.append(Cell(f"rounds/{name}", "rounds", argv))
    lk2 = ("--prompt-lookup-min", "2")
    loads = {f"q{q}": ("--qps", str(q), *dur(300)) for q in (2, 6, 16)} | {
        "load-step": ("--scenario", "load-step", *scen)
    }
    for load, argv in loads.items():
        for s in SEEDS:
            one = Cell(
                f"replicas/{load}/s{s}/1", "replicas", (*argv, "--seed", str(s), *lk2, "--replicas", "1")
            )
            out.append(one)
            for n, peers in ((2, False), (4, False), (2, True), (4, True)):
                if load == "load-step" and (n, peers) == (2, False):
                    continue  # not among today's runs
                flags = (*one.argv[:-1], str(n), "--policies", "adaptive", *(("--peers",) if peers else ()))
                name = f"replicas/{load}/s{s}/{n}{'-peers' if peers else ''}"
                out.append(Cell(name, "replicas", flags, ref=one.name))
    return [c if "--policies" in c.argv else Cell(c.name, c.group, (*c.argv, "--policies", ALL)) for c in out]


@dataclass
class Done:
    """What one simulated run gives back to the matrix (records only for a scenario)."""

    summary: dict[str, Any]
    replicas: dict[str, float | None]
    records: list[RequestRecord] | None
    cpu_s: float


def run_one(cfg: SimConfig) -> Done:
    t = time.process_time()
    r = simulate(cfg)
    t0 = min(cfg.warmup_s, cfg.duration_s)
    rep: dict[str, float | None] = {}
    if cfg.replicas_reported:
        rep = {
            **r.replica_summary(t0 if cfg.phases else None),
            "switch_spread_s": switch_spread(r.samples, t0),
        }
    return Done(r.summary(), rep, r.records if cfg.phases else None, time.process_time() - t)


def _key(cfg: SimConfig) -> str:
    return repr(cfg)


def figures(p: Plan, done: Mapping[str, Done], ref: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A cell's figures from its runs (and, for a replica cell, its one-replica cell's)."""
    runs = {c.policy: done[_key(c)] for c in p.configs}
    if p.scenario is not None:
        span = p.scenario.duration_s
        recs = {pol: d.records or [] for pol, d in runs.items()}
        rep = scenario_report.build(
            recs, t0=min(p.args.warmup, span), t1=span, slo=Slo(), margin=p.args.switch_margin
        )
        ms = {r["policy"]: (r["mean_tpot_ms"], r["p99_tpot_ms"]) for r in rep["rows"]}
    else:
        rep = {}
        ms = {pol: (d.summary["mean_tpot_ms"], d.summary["p99_tpot_ms"]) for pol, d in runs.items()}
    f: dict[str, Any] = {"adaptive_ms": list(ms["adaptive"])}
    statics = {s: tuple(ref[f"{s}_ms"]) if ref else ms[s] for s in STATICS}
    for s, v in statics.items():
        f[f"{s}_ms"] = list(v)
    best = min(STATICS, key=lambda s: statics[s][0])
    other = STATICS[1 - STATICS.index(best)]
    f["best_static"] = best
    for tag, s in (("best", best), ("other", other)):
        f[f"vs_{tag}_mean"] = ms["adaptive"][0] / statics[s][0]
        f[f"vs_{tag}_p99"] = ms["adaptive"][1] / statics[s][1]
    ad = rep.get("adaptive")
    if ad:
        f.update(vs_oracle=ad["vs_oracle"], captured=ad["capture"], worst_minute=ad["worst_minute"])
    if ref:
        f["vs_one_replica_mean"] = ms["adaptive"][0] / ref["adaptive_ms"][0]
        f["vs_one_replica_p99"] = ms["adaptive"][1] / ref["adaptive_ms"][1]
    f.update(runs["adaptive"].replicas)
    f["cpu_s"] = round(sum(d.cpu_s for d in runs.values()), 1)
    return f


def check(result: Mapping[str, Any], floor: Mapping[str, Any] | None) -> list[str]:
    """What fails: cells worse than their floor × 1.01 (mean ÷ best static), missed targets."""
    fails = []
    cur = result["cells"]
    if floor is not None:
        for name, f in cur.items():
            old = floor["cells"].get(name)
            if old and f["vs_best_mean"] > old["vs_best_mean"] * FLOOR_TOLERANCE:
                fails.append(
                    f"floor   {name}: mean ÷ best static {f['vs_best_mean']:.3f} > floor "
                    f"{old['vs_best_mean']:.3f} × {FLOOR_TOLERANCE:g}"
                )
    for t in TARGETS:
        for name, f in cur.items():
            v = f.get(t.metric)
            if not (re.search(t.cells, name) and isinstance(v, float)) or math.isnan(v):
                continue
            if v > t.bound if t.upper else v < t.bound:
                op = "≤" if t.upper else "≥"
                fails.append(f"target  {name}: {t.metric} {v:.3f}, wants {op} {t.bound:g} ({t.why})")
    return fails


def _fmt(v: object, nd: int = 3) -> str:
    if isinstance(v, float):
        return "–" if math.isnan(v) else f"{v:.{nd}f}"
    return "–" if v is None else str(v)


def markdown(result: Mapping[str, Any]) -> str:
    head = (
        "cell", "adaptive mean / p99 (ms)", "best static", "÷ best mean", "÷ best p99", "÷ other mean",
        "÷ other p99", "÷ oracle", "captured", "worst min", "÷ one replica mean / p99", "modes differ",
    )  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, f in result["cells"].items():
        one = f.get("vs_one_replica_mean")
        row = (
            name,
            f"{f['adaptive_ms'][0]:.2f} / {f['adaptive_ms'][1]:.2f}",
            f["best_static"],
            *(_fmt(f.get(k)) for k in ("vs_best_mean", "vs_best_p99", "vs_other_mean", "vs_other_p99")),
            *(_fmt(f.get(k)) for k in ("vs_oracle", "captured", "worst_minute")),
            "–" if one is None else f"{one:.3f} / {f['vs_one_replica_p99']:.3f}",
            _fmt(f.get("modes_differ")),
        )
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def run(
    chosen: list[Cell], jobs: int, say: Callable[[str], None] = print
) -> tuple[dict[str, dict[str, Any]], float]:
    """Every cell's figures and the CPU seconds of all runs, each distinct run simulated once
    (largest first, ``jobs`` processes)."""
    plans = {c.name: c.plan() for c in chosen}
    todo = {_key(cfg): cfg for p in plans.values() for cfg in p.configs}
    order = sorted(todo, key=lambda k: -_cost(todo[k]))
    done: dict[str, Done] = {}

    def took(k: str, d: Done) -> None:
        done[k] = d
        say(f"[{len(done)}/{len(todo)}] {todo[k].policy} seed {todo[k].seed}: {d.cpu_s:.1f} s CPU")

    if jobs <= 1:
        for k in order:
            took(k, run_one(todo[k]))
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            futs = {pool.submit(run_one, todo[k]): k for k in order}
            for fut in as_completed(futs):
                took(futs[fut], fut.result())
    out: dict[str, dict[str, Any]] = {}
    for c in chosen:  # one-replica cells come before the cells that name them
        out[c.name] = figures(plans[c.name], done, out[c.ref] if c.ref else None)
    return out, sum(d.cpu_s for d in done.values())


def _cost(cfg: SimConfig) -> float:
    """Requests the run will simulate (an ordering key for the pool)."""
    if cfg.phases:
        return sum(p.duration_s * (p.start_qps + p.end_qps) / 2 for p in cfg.phases)
    return cfg.qps * cfg.duration_s


def select(all_cells: Iterable[Cell], only: str | None) -> list[Cell]:
    """The cells whose names match ``only`` (a regular expression), and the one-replica cells
    they are compared with."""
    every = list(all_cells)
    keep = {c.name for c in every if only is None or re.search(only, c.name)}
    keep |= {c.ref for c in every if c.name in keep and c.ref}
    return [c for c in every if c.name in keep]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="simulations in parallel")
    ap.add_argument("--quick", action="store_true", help="every run 10 × shorter (a smoke run)")
    ap.add_argument(
        "--only", default=None, help="a regular expression on cell names, e.g. 'eagle3|sweep/lookup5'"
    )
    ap.add_argument("--out", type=Path, default=None, help="write matrix.json and matrix.md here")
    ap.add_argument("--floor", type=Path, default=None, help="a matrix.json to hold (exit 1 on a failure)")
    ap.add_argument("--list", action="store_true", help="print the cells' command lines and stop")
    args = ap.parse_args(argv)
    chosen = select(cells(args.quick), args.only)
    if args.list:
        for c in chosen:
            print(f"{c.name:<38} specgate simulate {' '.join(_quote(a) for a in c.argv)}")
        print(f"{len(chosen)} cells, {len({_key(x) for c in chosen for x in c.plan().configs})} runs")
        return 0
    floor = json.loads(args.floor.read_text()) if args.floor else None
    if floor is not None and bool(floor["meta"]["quick"]) != args.quick:
        print("the floor was recorded with a different --quick", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    figs, cpu = run(chosen, args.jobs)
    meta = {"quick": args.quick, "only": args.only, "jobs": args.jobs, "cpu_s": round(cpu, 1)}
    result: dict[str, Any] = {"meta": {**meta, "wall_s": round(time.monotonic() - t0, 1)}, "cells": figs}
    fails = check(result, floor)
    result["fails"] = fails
    md = markdown(result)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "matrix.json").write_text(json.dumps(result, indent=1, sort_keys=False) + "\n")
        (args.out / "matrix.md").write_text(md)
    print(md)
    print("\n".join(fails) or "every target met" + (" and every cell within its floor" if floor else ""))
    print(f"{len(figs)} cells, {cpu:.0f} s CPU, {result['meta']['wall_s']} s wall")
    return 1 if fails and floor is not None else 0


def _quote(a: str) -> str:
    return a if re.fullmatch(r"[\w.,:=/+-]+", a) else "'" + a + "'"


if __name__ == "__main__":
    sys.exit(main())
