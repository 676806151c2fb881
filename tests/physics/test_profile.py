"""Step-time profiles reproduce the measured H200 table and extrapolate sanely."""

from __future__ import annotations

import pytest

from gateway.physics import PROFILE_NAMES, calibration_rows, get_profile


def _rows(model: str) -> list[dict[str, float]]:
    return [r for r in calibration_rows() if r["model"] == model]


@pytest.mark.parametrize("profile,model", [("h200-qwen3-8b", "qwen3-8b"), ("h200-qwen3-32b", "qwen3-32b")])
def test_step_times_match_measured_points_within_5_percent(profile: str, model: str) -> None:
    prof = get_profile(profile)
    rows = _rows(model)
    assert len(rows) >= 30
    for r in rows:
        got = prof.step_ms(r["batch"], r["q"], r["ctx"])
        assert got == pytest.approx(r["ms"], rel=0.05), r


@pytest.mark.parametrize("draft", ["qwen3-0.6b", "qwen3-1.7b"])
def test_draft_model_steps_match_measured_points(draft: str) -> None:
    prof = get_profile("h200-qwen3-8b")
    for r in _rows(draft):
        assert prof.small_model_step_ms(draft, r["batch"]) == pytest.approx(r["ms"], rel=0.05)
    # k sequential draft passes, each with its host overhead
    one = prof.small_model_step_ms(draft, 8) + prof.draft_pass_overhead_ms
    assert prof.draft_ms("draft_model", 4, 8, draft_model=draft) == pytest.approx(4 * one)


def test_interpolation_is_monotone_and_extrapolation_sane() -> None:
    prof = get_profile("h200-qwen3-8b")
    # monotone in batch, q and context across and beyond the grid
    for q in (1, 3, 6, 10):
        prev = 0.0
        for b in (1, 3, 12, 48, 100, 256, 400, 1024):
            v = prof.step_ms(b, q)
            assert v >= prev
            prev = v
    assert prof.step_ms(32, 7) > prof.step_ms(32, 6)
    assert prof.step_ms(64, 1, 8192) > prof.step_ms(64, 1, 4096) > prof.step_ms(64, 1, 1024)
    # compute-bound past the grid: doubling the batch roughly doubles the step
    assert 1.6 < prof.step_ms(512, 8) / prof.step_ms(256, 8) < 2.1
    # clamped below the grid
    assert prof.step_ms(0, 0) == prof.step_ms(1, 1)
    assert prof.step_ms(1, 1, 10) > 0.5 * prof.step_ms(1, 1)


def test_speculation_cost_ratio_matches_design_brief() -> None:
    prof = get_profile("h200-qwen3-8b")
    assert prof.step_ms(1, 6) / prof.step_ms(1, 1) == pytest.approx(1.07, abs=0.02)
    assert prof.step_ms(256, 6) / prof.step_ms(256, 1) == pytest.approx(2.7, abs=0.1)


def test_l4_roofline_matches_published_plain_tpot() -> None:
    l4 = get_profile("l4-qwen3-8b")
    # published: Qwen3-8B on one L4, plain decoding at concurrency 1: TPOT 60.2 ms
    assert l4.step_ms(1, 1, 1024) == pytest.approx(60.2, rel=0.05)
    # memory-bound at batch 1: verifying 6 tokens costs about the same as 1
    assert l4.step_ms(1, 6) / l4.step_ms(1, 1) < 1.03
    # compute-bound at large batch
    assert l4.step_ms(256, 6) / l4.step_ms(256, 1) > 1.3
    assert l4.prefill_ms(1000) > get_profile("h200-qwen3-8b").prefill_ms(1000)


def test_profiles_by_name() -> None:
    for name in PROFILE_NAMES:
        p = get_profile(name)
        assert p.name == name
        assert p.step_ms(1) > 0 and p.prefill_ms(100) > 0
        assert p.draft_ms("eagle3", 3, 1) > 0
        assert p.draft_ms("ngram", 5, 1) < p.step_ms(1)
    assert get_profile("h200-qwen3-8b") is get_profile("h200-qwen3-8b")
    with pytest.raises(KeyError):
        get_profile("tpu-v9")
