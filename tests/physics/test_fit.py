"""The step-time fit: exact on windows its own model generated, close on the H200 grid,
honest about what the windows cannot tell, and its profile file usable by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.physics import FitParams, FittedProfile, get_profile, load_fitted
from gateway.physics.fit import Window, fit_windows
from gateway.routing.steptime import get_step_model

TRUE = FitParams(
    base_ms=6.0,
    token_ms=0.004,
    knee_ms=0.03,
    knee_tokens=64.0,  # a knee at a window's own token count (the candidates searched)
    kv_ms=0.05,
    spec_host_overhead_ms=1.2,
    spec_per_seq_ms=0.02,
)


def _window(p: FitParams, spec: bool, batch: float, q: float, ctx: float, prefill: float = 0.0) -> Window:
    # the model's step: the knee on the N = batch x q tokens verified, prefill at both slopes
    n = batch * q
    t = p.base_ms + p.token_ms * n + p.knee_ms * max(0.0, n - p.knee_tokens) + p.kv_ms * batch * ctx / 1000
    t += (p.token_ms + p.knee_ms) * prefill
    if spec:
        t += p.spec_extra_ms(batch)
    return Window(spec=spec, step_ms=t, batch=batch, verify_tokens=batch * q, prefill_tokens=prefill, ctx=ctx)


def _synthetic() -> list[Window]:
    ws = []
    for b in (1, 2, 4, 8, 16, 32, 64):
        for ctx in (500, 2000):
            ws.append(_window(TRUE, False, b, 1.0, ctx, prefill=float(b)))
            for q in (2.0, 4.0):
                ws.append(_window(TRUE, True, b, q, ctx, prefill=float(b)))
    return ws


def test_fit_recovers_the_parameters_of_windows_its_model_generated() -> None:
    prof = fit_windows(_synthetic())
    p = prof.params
    assert p.knee_tokens == pytest.approx(TRUE.knee_tokens)
    for name in ("base_ms", "token_ms", "knee_ms", "kv_ms", "spec_host_overhead_ms", "spec_per_seq_ms"):
        assert getattr(p, name) == pytest.approx(getattr(TRUE, name), rel=1e-6), name
    assert prof.report is not None
    assert prof.report.rms_rel_error < 1e-9
    assert prof.report.not_fitted == ()
    # the profile prices each window's step as the fit's model did: decode, prefill, spec
    for w in _synthetic():
        got = prof.step_ms(w.batch, w.q, w.ctx) + prof.prefill_ms(round(w.prefill_tokens))
        got += p.spec_extra_ms(w.batch) if w.spec else 0.0
        assert got == pytest.approx(w.step_ms, rel=1e-6)


def test_fit_of_the_h200_grid_scaled_reproduces_it_within_6_percent_up_to_batch_256() -> None:
    """The model's reach: the shipped H200 profile x 1.3 (another GPU), plain and n-gram
    speculative windows (q = 3) at batch 1-256, read back within 6 %."""
    h200 = get_profile("h200-qwen3-8b")

    def truth(spec: bool, b: float, q: float) -> float:
        extra = h200.draft_ms("ngram", 5, b) + h200.spec_host_overhead_ms if spec else 0.0
        return 1.3 * (h200.step_ms(b, q, 1024) + extra)

    batches = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
    ws = [Window(False, truth(False, b, 1), b, b, ctx=1024) for b in batches]
    ws += [Window(True, truth(True, b, 3), b, 3 * b, ctx=1024) for b in batches]
    prof = fit_windows(ws, spec_method="ngram", spec_k=5)
    for w in ws:
        got = prof.step_ms(w.batch, w.q, w.ctx) + (prof.params.spec_extra_ms(w.batch) if w.spec else 0.0)
        assert got == pytest.approx(w.step_ms, rel=0.06), w
    assert prof.report is not None and prof.report.rms_rel_error < 0.03


def test_what_the_windows_cannot_tell_is_not_fitted_and_said() -> None:
    plain = [_window(TRUE, False, b, 1.0, 1024) for b in (1, 4, 16, 64)]
    prof = fit_windows(plain)
    assert prof.report is not None
    assert {"kv_ms", "spec_host_overhead_ms", "spec_per_seq_ms"} <= set(prof.report.not_fitted)
    assert prof.params.spec_host_overhead_ms == prof.params.spec_per_seq_ms == prof.params.kv_ms == 0.0
    # one q on the speculative engine: its drafting is read as verification, per token
    spec = [_window(TRUE, True, b, 3.0, 1024) for b in (1, 4, 16, 64)]
    prof = fit_windows(plain + spec)
    assert prof.report is not None and "spec_per_seq_ms" in prof.report.not_fitted
    for w in plain + spec:  # and still reproduces what it saw
        got = prof.step_ms(w.batch, w.q, w.ctx) + (prof.params.spec_extra_ms(w.batch) if w.spec else 0.0)
        assert got == pytest.approx(w.step_ms, rel=0.02)


def test_too_little_to_fit_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 4"):
        fit_windows([_window(TRUE, False, b, 1.0, 1024) for b in (1, 4, 16)])
    with pytest.raises(ValueError, match="one batch size"):
        fit_windows([_window(TRUE, False, 8, 1.0, 1024) for _ in range(6)])


def test_a_fitted_profile_file_is_a_profile_by_its_path(tmp_path: Path) -> None:
    prof = fit_windows(_synthetic(), name="my-gpu", model="my-model", spec_k=3, spec_method="eagle3")
    path = tmp_path / "my-gpu.json"
    path.write_text(prof.to_json(), encoding="utf-8")
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["format"] == "specgate-fitted-profile/1" and doc["report"]["windows"] == len(_synthetic())
    loaded = get_profile(str(path))
    assert isinstance(loaded, FittedProfile) and loaded.name == "my-gpu"
    assert loaded.step_ms(24, 2.5, 1500) == pytest.approx(prof.step_ms(24, 2.5, 1500))
    assert loaded.spec_host_overhead_ms == pytest.approx(TRUE.spec_host_overhead_ms)
    # a model drafter's cost scales with k over the fit's k; host lookup does not
    assert loaded.draft_ms("eagle3", 6, 10) == pytest.approx(2 * loaded.draft_ms("eagle3", 3, 10))
    assert loaded.draft_ms("ngram", 6, 10) == pytest.approx(loaded.draft_ms("ngram", 3, 10))
    assert loaded.prefill_ms(100) == pytest.approx(100 * (TRUE.token_ms + TRUE.knee_ms))
    # the routing core reads it as its prior
    steps = get_step_model(str(path), 1500)
    assert steps.step_ms(24, 1.0) == pytest.approx(loaded.step_ms(24, 1.0, 1500))
    assert steps.spec_extra_ms("eagle3", 3, 10) == pytest.approx(
        loaded.spec_host_overhead_ms + loaded.draft_ms("eagle3", 3, 10)
    )


def test_a_file_that_is_not_a_fitted_profile_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.json"
    path.write_text('{"name": "x"}', encoding="utf-8")
    with pytest.raises(ValueError, match="not a fitted step-time profile"):
        load_fitted(path)


def test_the_routing_config_takes_a_fitted_profile_file_and_refuses_a_missing_one(tmp_path: Path) -> None:
    from pydantic import ValidationError

    from gateway.routing.config import RoutingConfig

    path = tmp_path / "gpu.json"
    path.write_text(fit_windows(_synthetic()).to_json(), encoding="utf-8")
    assert RoutingConfig(profile=str(path)).profile == str(path)
    with pytest.raises(ValidationError, match="profile file"):
        RoutingConfig(profile=str(tmp_path / "missing.json"))
