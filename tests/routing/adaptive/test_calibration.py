"""Measured ÷ modelled latency per engine and load: shrunk toward the model, set by a steady
stream, forgotten once an engine serves nothing, and read at the load it was measured at."""

from __future__ import annotations

import math

import pytest

from gateway.routing.adaptive.calibration import LatencyBias
from gateway.routing.types import Route


def test_a_steady_stream_sets_the_bias_and_a_few_requests_barely_move_it() -> None:
    b = LatencyBias(tau_s=30.0, prior_weight=10.0)
    assert b.factor(Route.SPEC, 0.0) == 1.0
    for i in range(2):
        assert b.observe(Route.SPEC, 0.012, 0.010, 100, float(i))
    few = b.factor(Route.SPEC, 2.0)
    assert 1.0 < few < 1.04  # two requests against ten pseudo-requests of the model
    for i in range(300):  # ten per second for 30 s, all 20 % slower than modelled
        b.observe(Route.SPEC, 0.012, 0.010, 100, 2.0 + i / 10)
    assert b.factor(Route.SPEC, 32.0) == pytest.approx(1.2, rel=0.05)
    assert b.factor(Route.BASE, 32.0) == 1.0  # engines are tracked apart


def test_an_engine_that_serves_nothing_returns_to_the_model() -> None:
    b = LatencyBias(tau_s=30.0, prior_weight=10.0)
    for i in range(300):
        b.observe(Route.BASE, 0.008, 0.010, 100, i / 10)
    assert b.factor(Route.BASE, 30.0) == pytest.approx(0.8, rel=0.05)
    later = b.factor(Route.BASE, 150.0)  # two minutes without a request
    assert 0.8 < later < 0.97
    assert b.factor(Route.BASE, 600.0) == pytest.approx(1.0, abs=0.005)


def test_unusable_measurements_are_refused_and_outliers_clipped() -> None:
    b = LatencyBias(prior_weight=0.0)
    assert not b.observe(Route.SPEC, 0.01, 0.01, 5, 0.0)  # too short to time per token
    assert not b.observe(Route.SPEC, 0.0, 0.01, 100, 0.0)
    assert not b.observe(Route.SPEC, 0.01, -1.0, 100, 0.0)
    assert b.observe(Route.SPEC, 10.0, 0.01, 100, 0.0)  # a 1000× outlier counts as e^1
    assert b.log_bias(Route.SPEC, 0.0) == pytest.approx(1.0)
    snap = b.snapshot(0.0)["spec"]
    assert isinstance(snap, dict)
    assert (snap["factor"], snap["samples"]) == (round(math.e, 4), 1)


def test_the_plain_engines_gap_is_common_and_spec_keeps_only_its_own() -> None:
    """Plain decoding is the same physics on either engine: a gap the plain engine shows
    at the load spec runs at (say the profile's context length is off) is not held against
    speculation."""
    b = LatencyBias(tau_s=30.0, prior_weight=10.0)
    for i in range(300):
        b.observe(Route.BASE, 0.011, 0.010, 100, i / 10)  # plain: 10 % slower than modelled
        b.observe(Route.SPEC, 0.0132, 0.010, 100, i / 10)  # spec: 32 % = 10 % × 20 % own
    assert b.factor(Route.BASE, 30.0) == pytest.approx(1.1, rel=0.02)
    assert b.factor(Route.SPEC, 30.0, 1.0) == pytest.approx(1.2, rel=0.02)


def test_where_plain_was_not_measured_spec_keeps_only_the_offset_measured_elsewhere() -> None:
    """Only the engine that runs is measured. At 64 in flight only spec ran (40 % over the
    model): that may be common to both engines, so spec keeps only what it showed beyond
    plain where both ran (20 % at a light load), and nothing when they never ran at the
    same loads."""
    b = LatencyBias(tau_s=30.0, prior_weight=10.0)
    for i in range(300):
        b.observe(Route.SPEC, 0.014, 0.010, 100, i / 10, load=64.0)
    assert b.log_bias(Route.SPEC, 30.0, 64.0) == pytest.approx(math.log(1.4), rel=0.08)
    assert b.factor(Route.SPEC, 30.0, 64.0) == pytest.approx(1.0)  # never compared: common
    for i in range(300):
        b.observe(Route.SPEC, 0.012, 0.010, 100, 30.0 + i / 10, load=2.0)
        b.observe(Route.BASE, 0.010, 0.010, 100, 30.0 + i / 10, load=2.0)
        b.observe(Route.SPEC, 0.014, 0.010, 100, 30.0 + i / 10, load=64.0)
    assert b.factor(Route.SPEC, 60.0, 2.0) == pytest.approx(1.2, rel=0.03)
    assert b.factor(Route.SPEC, 60.0, 64.0) == pytest.approx(1.2, rel=0.05)


def test_the_error_is_kept_per_load_and_the_nearest_loads_speak_for_an_unmeasured_one() -> None:
    """A profile can price a light batch right and a full one wrong: what was measured at
    64 in flight does not move the estimate at 2, and at 128 (never measured) the nearest
    measured load speaks, less surely than where it was measured."""
    b = LatencyBias(tau_s=30.0, prior_weight=10.0)
    for i in range(300):
        for load in (2.0, 64.0):  # plain measured at both loads, as modelled
            b.observe(Route.BASE, 0.010, 0.010, 100, i / 10, load=load)
        b.observe(Route.SPEC, 0.010, 0.010, 100, i / 10, load=2.0)  # right at a light load
        b.observe(Route.SPEC, 0.007, 0.010, 100, i / 10, load=64.0)  # 30 % cheaper when full
    assert b.factor(Route.SPEC, 30.0, 2.0) == pytest.approx(1.0, abs=0.03)
    full = b.factor(Route.SPEC, 30.0, 64.0)
    assert full == pytest.approx(0.7, rel=0.05)
    beyond = b.factor(Route.SPEC, 30.0, 128.0)
    assert full < beyond < 0.8
    between = b.factor(Route.SPEC, 30.0, 11.0)  # as far from both: in between
    assert 0.75 < between < 0.95
    by_load = b.snapshot(30.0)["spec"]
    assert isinstance(by_load, dict)
    assert [row["load"] for row in by_load["by_load"]] == [2.0, 64.0]


def test_a_gap_is_repriced_with_the_corrections_measured_over_the_requests_life() -> None:
    """A request priced with corrections that had not converged (the prior's acceptance, an
    unfitted step time) ran 1.3 x its prediction; priced with what was measured over its
    life it ran as predicted: the bias learns nothing from it. Only what is left beyond the
    re-pricing is the model's error."""
    b = LatencyBias(tau_s=30.0, prior_weight=0.0)
    for i in range(100):
        b.observe(Route.SPEC, 0.013, 0.010, 100, i / 10, repriced=-math.log(1.3))
    assert b.log_bias(Route.SPEC, 10.0) == pytest.approx(0.0, abs=1e-9)
    for i in range(100):
        b.observe(Route.SPEC, 0.0143, 0.010, 100, 10.0 + i / 10, repriced=-math.log(1.3))
    assert b.factor(Route.SPEC, 20.0) == pytest.approx(1.05, rel=0.02)  # half the samples 10 % over
    c = LatencyBias(prior_weight=0.0)
    assert c.observe(Route.BASE, 0.02, 0.01, 100, 0.0, repriced=float("nan"))  # ignored
    assert c.log_bias(Route.BASE, 0.0) == pytest.approx(math.log(2.0))
