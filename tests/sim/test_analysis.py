"""Scenario metrics on synthetic records: oracle, goodput, worst minute, time to switch."""

from __future__ import annotations

import math

import pytest

from specgate_lab.sim import analysis as an
from specgate_lab.sim import scenario_report
from specgate_lab.sim.records import RequestRecord


def rec(t: float, route: str, tpot_ms: float, ttft_ms: float = 50.0, tokens: int = 100) -> RequestRecord:
    r = RequestRecord(t, "edit", "rename", "edit", 0.0, route, "test", False)
    r.tpot_s, r.ttft_s, r.output_tokens, r.finished_at = tpot_ms / 1e3, ttft_ms / 1e3, tokens, t + 1
    return r


def every_s(t0: float, t1: float, route: str, tpot_ms: float) -> list[RequestRecord]:
    return [rec(float(t), route, tpot_ms) for t in range(int(t0), int(t1))]


# Three minutes: spec is better in the first and last (5 vs 6 ms), base in the middle (8 vs 6).
SPEC = every_s(0, 60, "spec", 5) + every_s(60, 120, "spec", 8) + every_s(120, 180, "spec", 5)
BASE = every_s(0, 180, "base", 6)


def test_oracle_takes_the_better_static_per_minute() -> None:
    ms, mb = an.window_tpot(SPEC, 0.0), an.window_tpot(BASE, 0.0)
    choice = an.oracle_choice(ms, mb)
    assert choice == {0: an.SPEC, 1: an.BASE, 2: an.SPEC}
    pooled = an.oracle_records(SPEC, BASE, choice)
    assert len(pooled) == 180
    assert an.mean([r.tpot_s * 1e3 for r in pooled if r.tpot_s]) == pytest.approx((5 + 6 + 5) / 3)


def test_windows_fall_on_the_run_clock_and_skip_the_warmup() -> None:
    """With a 15-s warm-up the first window is [15, 60), so a phase change at 60 s starts a
    window: the oracle and the time to switch are measured from the change itself."""
    ms = an.window_tpot(SPEC, 15.0)
    assert sorted(ms) == [0, 1, 2]
    assert ms[1] == pytest.approx(8.0) and ms[2] == pytest.approx(5.0)
    assert an.window_tpot([rec(10, "spec", 99)], 15.0) == {}


def test_capture_share() -> None:
    assert an.capture(adaptive=5.5, best_static=6.0, oracle=5.0) == pytest.approx(0.5)
    assert an.capture(adaptive=6.6, best_static=6.0, oracle=5.0) == pytest.approx(-0.6)
    assert an.capture(adaptive=6.0, best_static=6.0, oracle=6.0) is None


def test_goodput_counts_only_requests_within_both_slos() -> None:
    recs = [rec(0, "spec", 10), rec(1, "spec", 30), rec(2, "base", 10, ttft_ms=2000)]
    s = an.summarize(recs, span_s=10.0, slo=an.Slo(tpot_ms=20, ttft_ms=1000))
    assert s["goodput_tok_s"] == pytest.approx(10.0)  # one request of 100 tokens in 10 s
    assert s["output_tok_s"] == pytest.approx(30.0)
    assert s["slo_share"] == pytest.approx(1 / 3)
    assert s["spec_share"] == pytest.approx(2 / 3)


def test_worst_minute_and_switch_times() -> None:
    # Adaptive stays on spec 20 s into the base minute, then moves; returns to spec 5 s late.
    ad = (
        every_s(0, 60, "spec", 5)
        + every_s(60, 80, "spec", 8)
        + every_s(80, 125, "base", 6)
        + every_s(125, 180, "spec", 5)
    )
    ms, mb, ma = an.window_tpot(SPEC, 0.0), an.window_tpot(BASE, 0.0), an.window_tpot(ad, 0.0)
    worst = an.worst_minute(ma, ms, mb)
    assert worst is not None and worst[1] == 1
    assert worst[0] == pytest.approx((20 * 8 + 40 * 6) / 60 / 6)
    sw = an.switch_times(ad, ms, mb, share_window_s=10.0)
    assert [(s.at_s, s.to) for s in sw] == [(60.0, "base"), (120.0, "spec")]
    # share of base in the trailing 10 s first exceeds half at t=85 (80..85 base: 6 of 10)
    assert sw[0].delay_s == pytest.approx(25.0)
    assert sw[1].delay_s == pytest.approx(10.0)  # (120, 130]: spec 125..130, 6 of 10
    never = an.switch_times(every_s(0, 180, "spec", 5), ms, mb)
    assert never[0].delay_s is None


def test_undecided_minutes_are_no_switch() -> None:
    spec = {0: 5.0, 1: 6.05, 2: 5.0}
    base = {0: 6.0, 1: 6.0, 2: 6.0}  # minute 1 within the 2 % margin: no change of regime
    assert an.switch_times([], spec, base) == []


def test_report_compares_adaptive_with_oracle_and_statics() -> None:
    base = every_s(0, 180, "base", 5.9)
    ad = every_s(0, 60, "spec", 5) + every_s(60, 180, "base", 5.9)
    rep = scenario_report.build(
        {"adaptive": ad, an.SPEC: SPEC, an.BASE: base}, t0=0.0, t1=180.0, slo=an.Slo()
    )
    a = rep["adaptive"]
    assert rep["best_static"] == an.BASE  # 5.9 against spec's 6.0
    ad_mean, oracle = (5 + 5.9 + 5.9) / 3, (5 + 5.9 + 5) / 3
    assert a["vs_oracle"] == pytest.approx(ad_mean / oracle)
    assert a["vs_best_static"] == pytest.approx(ad_mean / 5.9)
    assert a["capture"] == pytest.approx((5.9 - ad_mean) / (5.9 - oracle))
    assert a["max_switch_s"] == float("inf")  # never went back to spec in minute 3
    md = scenario_report.markdown(rep, "t")
    assert "| oracle |" in md and "never" in md


def test_a_compressed_day_compresses_the_oracles_minute() -> None:
    """The same three phases in 90 s: with 30-s windows the oracle still switches twice."""
    spec = every_s(0, 30, "spec", 5) + every_s(30, 60, "spec", 8) + every_s(60, 90, "spec", 5)
    base = every_s(0, 90, "base", 6)
    rep = scenario_report.build({an.SPEC: spec, an.BASE: base}, t0=0.0, t1=90.0, slo=an.Slo(), window_s=30.0)
    assert rep["window_s"] == 30.0
    assert rep["oracle_choice"] == {"0": an.SPEC, "1": an.BASE, "2": an.SPEC}
    oracle = next(r for r in rep["rows"] if r["policy"] == scenario_report.ORACLE)
    assert oracle["mean_tpot_ms"] == pytest.approx((5 + 6 + 5) / 3)
    # with the default minute the 90 s are two windows, and the first blurs two phases
    minute = scenario_report.build({an.SPEC: spec, an.BASE: base}, t0=0.0, t1=90.0, slo=an.Slo())
    assert minute["oracle_choice"] == {"0": an.BASE, "1": an.SPEC}


def test_the_simulators_percentile_is_a_sample_value() -> None:
    assert math.isnan(an.pct([], 0.99))
    xs = [float(v) for v in range(100, 0, -1)]  # 100 values, unsorted
    assert an.pct(xs, 0.99) == 100.0  # index floor(0.99 * 100) = 99: the largest
    assert an.pct(xs, 0.5) == 51.0 and an.pct(xs, 0.0) == 1.0 and an.pct(xs, 1.0) == 100.0
    assert an.pct([1.0, 2.0, 3.0, 4.0], 0.5) == 3.0  # no interpolation (linear would say 2.5)
