"""The routing matrix's cell logic: ratios against the statics, the floor and the targets,
the cells themselves (named once, each comparison cell after the cell it names), and one
tiny run end to end. No long simulation."""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.deploy.helpers import load_module

SCRIPT = Path(__file__).resolve().parents[2] / "loadtests" / "routing_matrix.py"


@pytest.fixture(scope="module")
def rm() -> ModuleType:
    return load_module(SCRIPT, "specgate_routing_matrix")


def _done(rm: ModuleType, mean: float, p99: float, **rep: float) -> Any:
    return rm.Done({"mean_tpot_ms": mean, "p99_tpot_ms": p99}, rep, None, 1.5)


def test_a_cell_reads_adaptive_against_the_best_and_the_other_static(rm: ModuleType) -> None:
    p = rm.Cell("c", "sweep", ("--qps", "2", "--duration", "5", "--policies", rm.ALL)).plan()
    runs = {"adaptive": (6.0, 9.0), "always-spec": (5.0, 8.0), "always-base": (7.0, 10.0)}
    done = {rm._key(c): _done(rm, *runs[c.policy]) for c in p.configs}
    f = rm.figures(p, done)
    assert f["best_static"] == "always-spec"
    assert (f["vs_best_mean"], f["vs_best_p99"]) == (pytest.approx(1.2), pytest.approx(9 / 8))
    assert (f["vs_other_mean"], f["vs_other_p99"]) == (pytest.approx(6 / 7), pytest.approx(0.9))
    assert f["cpu_s"] == 4.5


def test_a_replica_cell_takes_its_statics_and_one_replica_from_the_cell_it_names(rm: ModuleType) -> None:
    argv = ("--qps", "2", "--duration", "5", "--replicas", "4", "--policies", "adaptive")
    p = rm.Cell("r4", "replicas", argv, ref="r1").plan()
    done = {rm._key(p.configs[0]): _done(rm, 6.6, 12.0, modes_differ=0.02)}
    one = {"adaptive_ms": [6.0, 10.0], "always-spec_ms": [5.5, 11.0], "always-base_ms": [6.0, 10.0]}
    f = rm.figures(p, done, one)
    assert f["best_static"] == "always-spec"
    assert f["vs_best_mean"] == pytest.approx(1.2)
    assert f["vs_one_replica_mean"] == pytest.approx(1.1) and f["vs_one_replica_p99"] == pytest.approx(1.2)
    assert f["modes_differ"] == 0.02


def test_the_floor_allows_one_per_cent_and_the_targets_hold_where_they_apply(rm: ModuleType) -> None:
    def cell(mean: float, p99: float = 1.0, **more: float) -> dict[str, float]:
        return {"vs_best_mean": mean, "vs_best_p99": p99, **more}

    floor = {"cells": {"sweep/a": cell(1.0), "sweep/b": cell(1.0), "eagle3/x/s1": cell(1.3)}}
    result = {
        "cells": {
            "sweep/a": cell(1.009),  # within 1 %
            "sweep/b": cell(1.011),  # worse than its floor
            "sweep/new": cell(1.5),  # no floor, no target
            "eagle3/x/s1": cell(1.01, 1.2),  # better than its floor, but misses issue 52's p99
            "scenario/mix-shift/s2": cell(0.93, vs_oracle=1.005, captured=0.85),
            "scenario/temp-shift/s1": cell(0.95, vs_oracle=1.0, captured=math.nan),
        }
    }
    fails = rm.check(result, floor)
    assert [f.split(":")[0] for f in fails] == [
        "floor   sweep/b",
        "target  eagle3/x/s1",
        "target  scenario/mix-shift/s2",
    ]
    assert "vs_best_p99 1.200, wants ≤ 1.1" in fails[1] and "captured 0.850, wants ≥ 0.9" in fails[2]
    assert len(rm.check(result, None)) == 2  # the targets alone


def test_every_cell_is_named_once_and_its_reference_comes_first(rm: ModuleType) -> None:
    cells = rm.cells()
    names = [c.name for c in cells]
    assert len(names) == len(set(names))
    seen: set[str] = set()
    for c in cells:
        assert c.ref is None or c.ref in seen, c.name
        seen.add(c.name)
    for day in ("eagle3/eagle3-round16/s1", "eagle3/eagle3-newuser/s2", "scenario/day48/s3"):
        assert day in seen
    assert {c.group for c in cells} == {"scenario", "eagle3", "sweep", "device-scale", "rounds", "replicas"}
    full = {c.name: c.plan().configs[0] for c in cells}
    quick = {c.name: c.plan().configs[0] for c in rm.cells(quick=True)}
    assert full.keys() == quick.keys()
    assert all(quick[n].duration_s < full[n].duration_s for n in full)
    e3 = full["eagle3/eagle3-round16/s1"]
    assert (e3.method, e3.max_num_seqs, e3.spec_cost_slope, e3.seed) == ("eagle3", 64, -0.8, 1)
    picked = rm.select(cells, r"^replicas/q2/s1/4-peers$")
    assert [c.name for c in picked] == ["replicas/q2/s1/1", "replicas/q2/s1/4-peers"]


def test_a_tiny_matrix_runs_end_to_end(rm: ModuleType) -> None:
    tiny = [
        rm.Cell("point", "sweep", ("--qps", "1", "--duration", "3", "--warmup", "0", "--policies", rm.ALL)),
        rm.Cell("day", "scenario", ("--schedule", "1:3", "--warmup", "0", "--policies", rm.ALL)),
    ]
    figs, cpu = rm.run(tiny, jobs=1, say=lambda _: None)
    assert cpu > 0 and set(figs) == {"point", "day"}
    for f in figs.values():
        assert f["best_static"] in rm.STATICS and f["vs_best_mean"] > 0
    assert "vs_oracle" in figs["day"]
    md = rm.markdown({"cells": figs})
    assert md.count("\n") == 4 and "| day |" in md
