from __future__ import annotations

import math
import random

import pytest

from gateway.bench.stats import RequestRecord, percentile, summarize
from gateway.workload.schedule import PoissonPacer, parse_schedule


def test_step_schedule() -> None:
    s = parse_schedule("1:10,2:10,4:5")
    assert s.duration_s == 25
    assert [s.qps_at(t) for t in (0, 9.9, 10, 24.9)] == [1, 1, 2, 4]
    assert s.qps_at(25) is None and s.stage_index(25) is None
    assert s.stage_index(12) == 1 and s.peak_qps == 4


def test_ramp_open_ended_and_geometric_steps() -> None:
    r = parse_schedule("ramp:0-10:100,10")
    assert r.qps_at(50) == pytest.approx(5) and r.qps_at(1000) == 10 and math.isinf(r.duration_s)
    g = parse_schedule("steps:1-16:5x20")
    assert [st.start_qps for st in g.stages] == [1, 2, 4, 8, 16] and g.duration_s == 100


@pytest.mark.parametrize("bad", ["", "x", "-1", "2,4", "1:0", "ramp:1:10", "steps:0-4:3x10", "nan"])
def test_bad_schedules(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_schedule(bad)


def _rec(ttft: float, e2e: float, toks: int, ok: bool = True, route: str = "spec") -> RequestRecord:
    return RequestRecord(0, "edit", "rename", 0.0, ok, 200, ttft, e2e, toks, toks, route)


def test_summary() -> None:
    recs = [_rec(0.1, 1.1, 11), _rec(0.2, 2.2, 21, route="base"), _rec(0.1, 0.5, 0, ok=False)]
    s = summarize(recs, 2.0, tpot_slo_s=0.1)
    assert s["requests"] == 3 and s["failures"] == 1 and s["achieved_qps"] == 1.5
    assert s["tpot_mean_s"] == pytest.approx(0.1)
    assert s["output_tokens_per_s"] == 16
    assert s["route_share"] == {"base": 0.5, "spec": 0.5}
    assert s["goodput_rps"] == pytest.approx(1.0)  # both successes meet TPOT <= 0.1
    assert recs[0].tpot == pytest.approx(0.1) and recs[2].tpot is None


def test_percentile() -> None:
    assert percentile([], 50) is None
    assert percentile([1, 2, 3, 4], 50) == 2.5 and percentile([5], 99) == 5
    assert percentile([4, 1, 3, 2], 0) == 1 and percentile([4, 1, 3, 2], 100) == 4
    for bad in (-1, 101, 99.9):
        with pytest.raises(ValueError):
            percentile([1, 2], bad)


def _linear(values: list[float], q: float) -> float:
    """The definition written out: rank (n - 1) * q / 100, interpolated."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@pytest.mark.parametrize("n", [2, 3, 7, 100, 1001])
def test_percentile_interpolates_linearly(n: int) -> None:
    rng = random.Random(n)
    values = [rng.expovariate(1.0) for _ in range(n)]
    for q in (1, 25, 50, 90, 99):
        assert percentile(values, q) == pytest.approx(_linear(values, q), rel=1e-12)


def _arrivals(spec: str, pool: int, seed: int = 0) -> list[float]:
    sched = parse_schedule(spec)
    out: list[float] = []
    for i in range(pool):
        pacer = PoissonPacer(sched, pool, random.Random(f"{seed}:{i}"))
        while (t := pacer.advance(0.0)) is not None:
            out.append(t)
    return sorted(out)


def test_pool_of_pacers_offers_the_schedule() -> None:
    steps = _arrivals("5:100,20:100", pool=10)
    first = sum(1 for t in steps if t < 100)
    second = sum(1 for t in steps if 100 <= t < 200)
    assert 430 < first < 570 and 1800 < second < 2200
    assert steps[-1] < 200  # nothing after the schedule ends
    ramp = _arrivals("ramp:0-20:100", pool=4)
    assert 800 < len(ramp) < 1200  # mean rate 10 over 100 s
    assert sum(1 for t in ramp if t >= 50) > 2.5 * sum(1 for t in ramp if t < 50)


def test_pacer_skips_zero_qps_and_keeps_an_absolute_timeline() -> None:
    gap = _arrivals("0:50,10:20", pool=1)
    assert gap and min(gap) >= 50 and 150 < len(gap) < 250
    p = PoissonPacer(parse_schedule("10"), 1, random.Random(1))
    a = p.advance(now=100.0)
    b = p.advance(now=10_000.0)  # a busy sender: the next arrival follows the previous one
    assert a is not None and b is not None and 100 < a < b < a + 5
    with pytest.raises(ValueError):
        PoissonPacer(parse_schedule("1"), 0, random.Random())
