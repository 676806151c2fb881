from __future__ import annotations

import heapq
import math
import random

import pytest

from specgate_lab.bench.stats import RequestRecord, percentile, summarize
from specgate_lab.workload.schedule import PoissonPacer, grown_pool, parse_schedule, pool_size


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


def test_a_shared_stream_stays_over_once_the_schedule_ends() -> None:
    p = PoissonPacer(parse_schedule("10:1"), 1, random.Random(2))
    while p.advance(0.0) is not None:
        pass
    assert p.over and all(p.advance(0.0) is None for _ in range(200))  # no stray late arrival


def _shared(spec: str, pool: int, latency_s: float, seed: int = 0) -> tuple[int, list[float]]:
    """(requests sent within the schedule, their lateness) when ``pool`` senders share one
    arrival stream and each request takes ``latency_s``: the Locust kit's users (each
    arrival is queued when due; the first idle user takes it and sends)."""
    sched = parse_schedule(spec)
    arrivals = PoissonPacer(sched, 1, random.Random(seed))
    free = [0.0] * pool  # when each sender is next idle (a heap)
    sent, late = 0, []
    while (t := arrivals.advance(0.0)) is not None:
        start = max(t, heapq.heappop(free))  # the sender that is idle first takes it
        if start < sched.duration_s:
            sent += 1
            late.append(start - t)
        heapq.heappush(free, start + latency_s)
    return sent, late


@pytest.mark.parametrize(("qps", "latency_s"), [(0.5, 10.0), (4, 10.0), (16, 8.0), (64, 10.0)])
def test_the_default_pool_carries_the_qps_on_time(qps: float, latency_s: float) -> None:
    want = qps * 120
    sent, late = _shared(f"{qps}:120", pool_size(qps), latency_s)
    assert abs(sent - want) < 4 * math.sqrt(want) + 2  # Poisson noise only
    assert max(late) == 0.0  # an idle user for every arrival


def test_a_fixed_small_pool_under_delivers_and_the_grown_one_does_not() -> None:
    # 64 users at 8 s a request carry 8 req/s at most, whatever --qps says
    sent, late = _shared("16:120", 64, 8.0)
    assert sent < 0.55 * 16 * 120 and percentile(late, 50) > 10
    # answers slower than the first guess: the pool grows to carry the QPS
    grown = grown_pool(pool_size(16), 16, 30.0)
    assert grown > pool_size(16)
    sent, late = _shared("16:120", grown, 30.0)
    assert abs(sent - 16 * 120) < 4 * math.sqrt(16 * 120) and max(late) == 0.0


def test_pool_size_and_growth_rules() -> None:
    assert pool_size(0) == 8 and pool_size(2, 5.0) == 8 + 20 and pool_size(1000, 60.0) == 4096
    assert pool_size(16, 8.0, cap=100) == 100
    assert grown_pool(50, 2, None) == 50  # nothing timed yet
    assert grown_pool(50, 2, 1.0) == 50  # never shrunk
    assert grown_pool(50, 2, 30.0) == pool_size(2, 30.0) == 128
    for bad in ((-1.0, 1.0), (1.0, -1.0), (math.inf, 1.0), (1.0, math.nan)):
        with pytest.raises(ValueError):
            pool_size(*bad)
