"""Interleaved windows: intervals over rounds, and the A/A comparison beside every A/B."""

from __future__ import annotations

import math
import random

import pytest

from specgate_lab.bench.stats import RequestRecord
from specgate_lab.bench.windows import (
    compare,
    mean_interval,
    paired_ratio,
    report_md,
    slot_labels,
    window_row,
)


def test_a_shared_drift_cancels_in_the_paired_ratio() -> None:
    """Round after round the machine drifts by far more than the policies differ; the
    ratio of windows of the same round still finds the 5 % difference, while pooling the
    windows would not."""
    rng = random.Random(3)
    drift = [1.0 + 0.4 * rng.random() for _ in range(8)]
    a = [5.0 * d * (1.0 + rng.gauss(0, 0.005)) for d in drift]
    b = [5.25 * d * (1.0 + rng.gauss(0, 0.005)) for d in drift]
    r = paired_ratio(a, b)
    assert r.n == 8 and r.hi < 1.0 and r.point == pytest.approx(1 / 1.05, rel=0.01)
    pooled_a, pooled_b = mean_interval(a), mean_interval(b)
    assert pooled_a.hi > pooled_b.lo  # the pooled intervals overlap: no verdict


def test_an_a_a_comparison_contains_one_and_identical_rounds_give_a_point() -> None:
    rng = random.Random(5)
    a = [6.0 + rng.gauss(0, 0.3) for _ in range(10)]
    b = [6.0 + rng.gauss(0, 0.3) for _ in range(10)]
    assert paired_ratio(a, b).contains(1.0)
    same = paired_ratio([4.0, 5.0, 6.0], [4.0, 5.0, 6.0])
    assert (same.point, same.lo, same.hi) == (1.0, 1.0, 1.0)
    one = mean_interval([7.0])
    assert (one.point, one.lo, one.hi, one.n) == (7.0, 7.0, 7.0, 1)


def test_rounds_missing_a_figure_are_left_out_and_bad_input_is_refused() -> None:
    r = paired_ratio([2.0, 0.0, 3.0], [1.0, 4.0, 3.0])
    assert r.n == 2 and r.point == pytest.approx(math.sqrt(2.0))
    with pytest.raises(ValueError):
        paired_ratio([1.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        paired_ratio([0.0], [1.0])
    with pytest.raises(ValueError):
        mean_interval([])


def _rec(temperature: float, tpot_ms: float, route: str, ok: bool = True) -> RequestRecord:
    tokens = 11
    return RequestRecord(
        start=0.0,
        kind="chat",
        subkind="",
        temperature=temperature,
        ok=ok,
        ttft=0.01,
        e2e=0.01 + tpot_ms / 1000.0 * (tokens - 1),
        output_tokens=tokens,
        route=route,
    )


def test_a_window_row_splits_greedy_from_sampled_requests() -> None:
    recs = [_rec(0.0, 2.0, "spec"), _rec(0.0, 4.0, "spec"), _rec(0.7, 6.0, "base")]
    recs.append(_rec(1.0, 9.0, "base", ok=False))
    row = window_row(8, 2, "adaptive#2", "adaptive", recs)
    assert row["requests"] == 4 and row["failures"] == 1
    assert row["tpot_mean_ms"] == pytest.approx(4.0)
    assert row["tpot_mean_ms_t0"] == pytest.approx(3.0) and row["tpot_mean_ms_sampled"] == pytest.approx(6.0)
    assert row["spec_share"] == 0.5
    empty = window_row(8, 0, "x", "always-base", [])
    assert empty["tpot_mean_ms"] is None and empty["spec_share"] is None


def test_every_slot_pair_is_compared_and_the_repeat_is_the_a_a() -> None:
    labels = slot_labels(["adaptive", "always-spec", "always-base", "adaptive"])
    assert labels == ["adaptive", "always-spec", "always-base", "adaptive#2"]
    windows = []
    for rnd in range(4):
        drift = 1.0 + 0.1 * rnd
        for lab, ms in zip(labels, (5.0, 4.0, 6.0, 5.0), strict=True):
            row = {"concurrency": 8, "round": rnd, "slot": lab, "requests": 10}
            row |= {"tpot_mean_ms": ms * drift, "tpot_p99_ms": 2 * ms * drift}
            row |= {"tpot_mean_ms_t0": ms * drift, "tpot_mean_ms_sampled": None}
            windows.append(row)
    out = compare(windows, labels)["8"]
    assert out["slots"]["always-spec"]["windows"] == 4 and out["slots"]["always-spec"]["requests"] == 40
    assert len(out["pairs"]) == 6
    assert out["pairs"]["adaptive / always-spec"]["tpot_mean_ms"]["point"] == pytest.approx(1.25)
    assert out["pairs"]["adaptive / adaptive#2"]["tpot_mean_ms"]["point"] == pytest.approx(1.0)
    assert out["pairs"]["adaptive / always-base"]["tpot_mean_ms_sampled"] is None  # no sampled requests
    meta = {"pair": "ngram", "labels": labels, "rounds": 4, "measure_s": 10.0, "target": "emulated"}
    md = report_md(compare(windows, labels), meta | {"time_scale": 1.0})
    assert "| adaptive / adaptive#2 | 1.000 [1.000, 1.000]" in md and "## C = 8" in md
