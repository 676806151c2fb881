"""The fleet matrix's cell logic (issue 53's grid): the cells and the targets a cell is
judged on; and the decision-cost bench's record and replay on a small fleet. No long
simulation."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest

from tests.deploy.helpers import load_module

SCRIPT = Path(__file__).resolve().parents[2] / "loadtests" / "fleet_matrix.py"


@pytest.fixture(scope="module")
def fm() -> ModuleType:
    return load_module(SCRIPT, "specgate_fleet_matrix")


def row(policy: str, mean: float, p99: float) -> dict[str, float | str]:
    return {"policy": policy, "mean_tpot_ms": mean, "p99_tpot_ms": p99, "spec_share": 0.5}


def test_the_grid_is_the_issues(fm: ModuleType) -> None:
    cells = fm.cells(120.0, fm.CAPACITY)
    assert len(cells) == 2 * 3 * 2 * 3 * 4
    c = next(c for c in cells if c.name == "p16/chat/lk5/s3/90")
    assert c.cfg.pairs == 16 and c.cfg.seed == 3 and c.cfg.prompt_lookup_min == 5
    assert c.cfg.qps == pytest.approx(0.9 * 16 * fm.CAPACITY["lk5"])
    assert "--pairs 16" in fm.command(c.cfg) and "--oracle" in fm.command(c.cfg)


def test_a_cell_is_judged_against_the_best_static_and_the_oracle(fm: ModuleType) -> None:
    rows = [
        row("adaptive", 5.7, 7.3),
        row("always-spec", 6.4, 8.0),
        row("always-base", 6.2, 6.8),
        row("assign:edit:1", 5.6, 7.1),
        row("assign::0", 6.2, 6.8),
    ]
    j = fm.judge(rows)
    assert j["vs_static"] == pytest.approx(5.7 / 6.2) and j["vs_oracle"] == pytest.approx(5.7 / 5.6)
    assert j["classes_differ"]  # the oracle is 10 % ahead of the best static
    misses = fm.misses("c", j)
    assert len(misses) == 1 and "p99" in misses[0]  # 7.3 / 6.8 > 1.05; the means hold


def test_a_replayed_record_decides_as_the_run_did() -> None:
    """The decision-cost bench records a short simulated run's calls on the fleet policy
    (decisions, answers, moves) and replays them on a fresh policy: the same decisions, so
    the replay times what the run did, and checks that a policy change left them alone."""
    dc = load_module(SCRIPT.parent / "decision_cost.py", "specgate_decision_cost")
    rec = dc.record(2, 0.5, 4.0, 1)
    ops = [c[0] for c in rec.calls]
    assert ops.count("d") > 100 and ops.count("o") > 50  # it learned from answers too
    result, differ = dc.measure(rec, 1, 1.0)
    assert differ == []
    run = result["runs"][0]
    assert result["pairs"] == 2 and 0 < run["decisions"] < ops.count("d")  # the warm-up left out
    assert 0 < run["p50_us"] <= run["p99_us"]

    first = next(i for i, c in enumerate(rec.calls) if c[0] == "d")
    _, features, view, now, decision = rec.calls[first]
    other = next(e for p in view.pairs for e in p.engines if e.name != decision.engine)
    rec.calls[first] = ("d", features, view, now, replace(decision, engine=other.name))
    assert dc.replay(rec).differ  # a decision otherwise than recorded is reported
