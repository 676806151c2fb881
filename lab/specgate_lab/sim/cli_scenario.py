"""``specgate simulate --scenario NAME`` / ``--schedule SPEC``: every policy over one scenario.

Each policy runs the whole scenario once on identical arrivals and requests (``--jobs``
policies in parallel); the report compares them with the per-minute oracle of the statics
(see :mod:`specgate_lab.sim.analysis`). Writes ``results.{csv,json,md,png}``, ``minutes.csv``
and ``phases.csv`` under ``--out`` (default ``results/sim/scenarios/NAME``).
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from specgate_lab.sim import analysis as an
from specgate_lab.sim import scenario_report
from specgate_lab.sim.agreement import switch_spread
from specgate_lab.sim.fleet import simulate_any
from specgate_lab.sim.records import SimConfig, SimResult
from specgate_lab.sim.report import write_csv
from specgate_lab.sim.run import phase_summaries
from specgate_lab.sim.scenarios import Scenario


def slo_of(args: argparse.Namespace) -> an.Slo:
    return an.Slo(tpot_ms=float(args.slo_tpot_ms), ttft_ms=float(args.slo_ttft_ms))


def run_all(cfgs: list[SimConfig], jobs: int) -> list[SimResult]:
    if jobs > 1 and len(cfgs) > 1:
        with ProcessPoolExecutor(max_workers=min(jobs, len(cfgs))) as pool:
            return list(pool.map(simulate_any, cfgs))
    return [simulate_any(c) for c in cfgs]


def run_scenario(args: argparse.Namespace, scenario: Scenario, cfgs: list[SimConfig]) -> int:
    t_start = time.monotonic()
    results = run_all(cfgs, args.jobs)
    recs = {r.config.policy: r.records for r in results}
    t0 = min(args.warmup, scenario.duration_s)
    report = scenario_report.build(
        recs, t0=t0, t1=scenario.duration_s, slo=slo_of(args), margin=args.switch_margin
    )
    out: Path = args.out or Path("results/sim/scenarios") / scenario.name
    c0 = cfgs[0]
    meta: dict[str, Any] = {
        "command": "specgate simulate " + " ".join(sys.argv[2:]),
        "scenario": scenario.name,
        "description": scenario.description,
        "phases": [p.__repr__() for p in scenario.phases],
        "seed": c0.seed,
        "mix": c0.mix or "corpus default",
        "temperature": c0.temperature,
        "profile": c0.profile,
        "method": c0.method,
        "k": c0.k,
        "prompt_lookup": [c0.prompt_lookup_min, c0.prompt_lookup_max],
        "spec_cost_scale": c0.spec_cost_scale,
        "spec_cost_slope": c0.spec_cost_slope,
        "device_scale": c0.device_scale,
        "device_scale_slope": c0.device_scale_slope,
        "scenario_pair": scenario.pair.describe(),
        "spec_config": c0.spec_extra,
        "spec_overhead_ms": c0.spec_overhead_ms,
        "max_num_seqs": c0.max_num_seqs,
        "warmup_s": t0,
        "policy_state": {r.config.policy: r.policy_state for r in results},
        "wall_s": round(time.monotonic() - t_start, 1),
    }
    if c0.replicas_reported:  # how far the replicas agreed, per policy
        meta["replicas"] = c0.replicas
        meta["peers"] = c0.peers
        meta["replica_agreement"] = {
            r.config.policy: {**r.replica_summary(t0), "switch_spread_s": switch_spread(r.samples, t0)}
            for r in results
        }
    title = f"{scenario.name}: {scenario.description} (seed {c0.seed})"
    md = scenario_report.write(report, meta, out, title)
    rows = [row for r in results for row in phase_summaries(r)]
    write_csv(rows, out / "phases.csv", extra=("phase_start_s",))
    drawn = scenario_report.plot(report, recs.get("adaptive"), scenario.phases, out / "results.png", title)
    print(md)
    for policy, agree in meta.get("replica_agreement", {}).items():
        print(f"{c0.replicas} replicas{' (peers)' if c0.peers else ''}, {policy}: {agree}")
    png = ",png" if drawn else ""
    print(f"wrote {out}/results.{{csv,json,md{png}}}, minutes.csv, phases.csv in {meta['wall_s']} s")
    return 0
