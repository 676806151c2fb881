"""Step time measured against the profile, per engine and load, on one device: the error
common to both engines (the GPU) and each engine's own offset (:mod:`.stepscale`)."""

from __future__ import annotations

import pytest

from gateway.routing.adaptive.stepscale import StepScales


def fit(s: StepScales, spec: bool, load: float, ratio: float, t0: float, n: int = 20) -> float:
    for i in range(n):
        s.observe(spec, load, ratio, t0 + i)
    return t0 + n


def test_nothing_measured_reads_the_profile() -> None:
    s = StepScales()
    assert s.scale(True, 8.0, 0.0) == 1.0 and s.scale(False, 8.0, 0.0) == 1.0
    assert not s.assumed(True) and not s.assumed(False)


def test_an_engine_never_measured_is_assumed_as_slow_as_the_device() -> None:
    """Spec measured 2x the profile on a slower GPU: plain, on the same GPU, is taken to be
    2x too (not the bare profile, which made the pair flip to it), and marked as assumed."""
    s = StepScales()
    t = fit(s, True, 8.0, 2.0, 0.0)
    assert s.scale(True, 8.0, t) == pytest.approx(2.0, rel=0.01)
    assert s.scale(False, 8.0, t) == pytest.approx(2.0, rel=0.01)
    assert s.assumed(False) and not s.assumed(True)


def test_an_engine_offset_measured_at_one_load_holds_at_another() -> None:
    """Both measured at batch 8 (spec 2x: its drafter is dear; plain 1x). At batch 128 only
    spec runs and reads 3x: the load's common part (1.5x) carries over to plain, and the
    engines' offset (2x) stays."""
    s = StepScales()
    t = fit(s, True, 8.0, 2.0, 0.0)
    t = fit(s, False, 8.0, 1.0, t)
    assert not s.assumed(False)
    t = fit(s, True, 128.0, 3.0, t)
    assert s.scale(True, 128.0, t) == pytest.approx(3.0, rel=0.03)
    assert s.scale(False, 128.0, t) == pytest.approx(1.5, rel=0.05)
    # where each was measured, its own measurement stands
    assert s.scale(False, 8.0, t) == pytest.approx(1.0, rel=0.05)


def test_measurements_age_out_toward_what_is_left() -> None:
    s = StepScales(tau_s=60.0)
    t = fit(s, True, 8.0, 2.0, 0.0)
    fit(s, True, 8.0, 1.0, t + 600.0)  # ten time constants later the device reads 1x
    assert s.scale(True, 8.0, t + 620.0) == pytest.approx(1.0, rel=0.02)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_a_nonsense_ratio_is_ignored(bad: float) -> None:
    s = StepScales()
    s.observe(True, 8.0, bad, 0.0)
    assert s.fits[True] == 0 and s.scale(True, 8.0, 1.0) == 1.0
