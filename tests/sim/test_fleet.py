"""``specgate simulate --pairs N``: a fleet of pairs, each on its own device; pairs lost and
added mid-run; the offline oracle; one pair simulated exactly as before."""

from __future__ import annotations

import argparse
from dataclasses import replace

import pytest

from specgate_lab.sim.cli_simulate import configure
from specgate_lab.sim.fleet import is_fleet, join_delays, simulate_any, simulate_fleet
from specgate_lab.sim.oracle import search
from specgate_lab.sim.plan import plan
from specgate_lab.sim.records import SimConfig
from specgate_lab.sim.run import arrivals, simulate

SHORT = SimConfig(qps=12.0, duration_s=16.0, warmup_s=2.0, drain_s=120.0, prompt_lookup_min=2)


def test_one_pair_is_the_single_pair_simulator() -> None:
    cfg = replace(SHORT, qps=4.0, duration_s=8.0)
    assert not is_fleet(cfg)
    a, b = simulate_any(cfg), simulate(cfg)
    assert a.summary() == b.summary()
    assert [(r.route, r.reason, r.tpot_s) for r in a.records] == [
        (r.route, r.reason, r.tpot_s) for r in b.records
    ]


def test_a_fleet_serves_every_request_on_every_pair() -> None:
    cfg = replace(SHORT, pairs=3)
    result = simulate_fleet(cfg)
    assert result.records and all(r.finished_at is not None for r in result.records)
    devices = {r.engine[-1] for r in result.records}
    assert devices == {"0", "1", "2"}
    assert "fleet" in result.policy_state


def test_a_lost_pair_loses_no_request_and_a_new_pair_serves_within_seconds() -> None:
    cfg = replace(SHORT, pairs=3, duration_s=24.0, pair_events=((8.0, -1), (14.0, 1)))
    result = simulate_fleet(cfg)
    assert all(r.finished_at is not None for r in result.records)  # 0 failed
    assert any(r.migrated and r.arrival < 8.0 for r in result.records)  # sent again
    assert not any(r.engine.endswith("2") and r.arrival > 8.0 for r in result.records)
    assert join_delays(result)[0] < 10.0


def test_the_oracle_is_at_least_as_good_as_either_static_fleet() -> None:
    cfg = replace(SHORT, pairs=2, duration_s=10.0)
    work = arrivals(cfg)
    best, rows = search(cfg, work)
    assert best["policy"] == "oracle" and str(best["assignment"]).startswith("assign:")
    statics = [r for r in rows if str(r["assignment"]).endswith((":0", ":2"))]
    assert len(statics) == 2
    assert float(best["mean_tpot_ms"]) <= min(float(r["mean_tpot_ms"]) for r in statics)
    assert len(rows) == 2 + 3  # the statics, and each of the 3 cuts of 4 kinds on 1 pair


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    configure(parser)
    return parser.parse_args(list(argv))


def test_the_command_line_asks_for_a_fleet() -> None:
    p = plan(_args("--pairs", "4", "--qps", "80", "--pair-events", "60:-1,90:+1"))
    assert {c.pairs for c in p.configs} == {4} and {c.qps for c in p.configs} == {80.0}
    assert p.configs[0].pair_events == ((60.0, -1), (90.0, 1))
    assert all(is_fleet(c) for c in p.configs)
    # a scenario on a fleet: each pair sees about the scenario's load
    one = plan(_args("--scenario", "load-step", "--policies", "adaptive"))
    four = plan(_args("--scenario", "load-step", "--policies", "adaptive", "--pairs", "4"))
    assert [4 * ph.start_qps for ph in one.configs[0].phases] == [
        ph.start_qps for ph in four.configs[0].phases
    ]
    for bad in (("--pair-events", "60:2"), ("--pairs", "0"), ("--pairs", "2", "--replicas", "2")):
        with pytest.raises(ValueError):
            plan(_args(*bad))
