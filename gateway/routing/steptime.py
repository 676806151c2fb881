"""Step-time prior T(batch, q): milliseconds for one engine step of ``batch`` sequences
each verifying ``q`` tokens (q = k + 1 on a speculative engine, 1 on a plain one).

The calibration profiles live in :mod:`gateway.physics` (``get_profile(name)`` with
``step_ms(batch, q, ctx)``). This module adapts one to the routing core, and carries a
small built-in copy of the H200 Qwen3-8B table (the decode grid of
``gateway/physics/data``) as a fallback, so the decision core never fails for want of a
profile. The router treats it as a *prior* and corrects it online with measured step
times (:mod:`gateway.routing.live`) and measured time per token
(:mod:`gateway.routing.calibration`).
"""

from __future__ import annotations

import bisect
import importlib
import logging
from typing import Any, Protocol

log = logging.getLogger(__name__)

DEFAULT_PROFILE = "h200-qwen3-8b"

# H200, Qwen3-8B shape, 1024-token context, CUDA-graph replay (ms per step).
_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_QS = (1, 2, 3, 4, 5, 6, 8)
_H200_QWEN3_8B = (
    (5.52, 5.80, 5.87, 5.88, 5.89, 5.90, 5.89),
    (5.61, 5.90, 5.92, 5.92, 5.97, 5.98, 6.00),
    (5.68, 5.93, 6.00, 6.01, 6.06, 6.07, 6.13),
    (5.74, 6.03, 6.09, 6.15, 6.23, 6.27, 6.26),
    (5.91, 6.27, 6.38, 6.37, 6.62, 6.74, 6.85),
    (6.65, 7.03, 7.40, 7.54, 8.08, 8.90, 9.98),
    (8.03, 8.85, 10.35, 11.67, 13.29, 15.28, 17.70),
    (11.53, 14.47, 18.08, 20.46, 24.13, 26.96, 33.82),
    (19.80, 26.27, 33.08, 39.78, 46.72, 53.52, 67.13),
)


class StepModel(Protocol):
    def step_ms(self, batch: float, q: float) -> float:
        """One target-model step: ``batch`` sequences verifying ``q`` tokens each."""
        ...

    def spec_extra_ms(self, method: str, k: int, batch: float) -> float:
        """Drafting and host overhead a speculative engine adds to each step."""
        ...

    def prefill_ms(self, tokens: float) -> float:
        """Device time to prefill ``tokens`` prompt tokens (chunked into the steps)."""
        ...


# Host time a speculative engine adds per step (rejection sampling, bookkeeping, async
# scheduling off) and the n-gram proposer's own time, when no profile says otherwise.
_SPEC_HOST_MS = 0.8
_NGRAM_PROPOSER_MS = 0.15
_NGRAM_PROPOSER_MS_PER_SEQ = 0.004
_PREFILL_MS_PER_TOKEN = 0.0266  # Qwen3-8B on an H200 (the physics profile's figure)


def _interp(xs: tuple[int, ...], x: float) -> tuple[int, int, float]:
    """Bracketing indices and weight; linear extrapolation past the last point."""
    if x <= xs[0]:
        return 0, 0, 0.0
    if x >= xs[-1]:
        i = len(xs) - 2
        return i, i + 1, (x - xs[i]) / (xs[i + 1] - xs[i])
    j = bisect.bisect_left(xs, x)
    i = j - 1
    return i, j, (x - xs[i]) / (xs[j] - xs[i])


class TableStepModel:
    """Bilinear interpolation over a (batch × q) grid of measured step times."""

    def __init__(
        self,
        batches: tuple[int, ...] = _BATCHES,
        qs: tuple[int, ...] = _QS,
        table: tuple[tuple[float, ...], ...] = _H200_QWEN3_8B,
    ) -> None:
        self.batches, self.qs, self.table = batches, qs, table

    def step_ms(self, batch: float, q: float) -> float:
        if batch <= 0:
            return 0.0
        bi, bj, bw = _interp(self.batches, batch)
        qi, qj, qw = _interp(self.qs, q)
        t = self.table

        def row(r: int) -> float:
            return t[r][qi] * (1 - qw) + t[r][qj] * qw

        return max(0.1, row(bi) * (1 - bw) + row(bj) * bw)

    def spec_extra_ms(self, method: str, k: int, batch: float) -> float:
        b = max(batch, 1.0)
        if method in ("ngram", "ngram_gpu", "suffix"):
            return _SPEC_HOST_MS + _NGRAM_PROPOSER_MS + _NGRAM_PROPOSER_MS_PER_SEQ * b
        # Model drafters: roughly one small step per draft token (~7 % of a target step).
        return _SPEC_HOST_MS + 0.07 * k * self.step_ms(b, 1.0)

    def prefill_ms(self, tokens: float) -> float:
        return max(0.0, tokens) * _PREFILL_MS_PER_TOKEN


class _PhysicsAdapter:
    """A :mod:`gateway.physics` profile, memoised on a (batch, q) grid of quarter steps."""

    def __init__(self, profile: Any, ctx: int) -> None:
        self._p, self._ctx = profile, float(ctx)
        self._cache: dict[tuple[float, float], float] = {}

    def step_ms(self, batch: float, q: float) -> float:
        if batch <= 0:
            return 0.0
        key = (round(batch * 4) / 4, round(q * 4) / 4)
        v = self._cache.get(key)
        if v is None:
            v = float(self._p.step_ms(key[0], key[1], self._ctx))
            if len(self._cache) < 65536:
                self._cache[key] = v
        return v

    def spec_extra_ms(self, method: str, k: int, batch: float) -> float:
        b = max(batch, 1.0)
        host = float(getattr(self._p, "spec_host_overhead_ms", _SPEC_HOST_MS))
        try:
            return host + float(self._p.draft_ms(method, max(k, 1), b, self._ctx))
        except Exception:
            return host + _NGRAM_PROPOSER_MS

    def prefill_ms(self, tokens: float) -> float:
        return float(self._p.prefill_ms(max(0, round(tokens))))


def get_step_model(profile: str = DEFAULT_PROFILE, ctx: int = 1024) -> StepModel:
    """The named calibration profile from :mod:`gateway.physics`, or the built-in table."""
    try:
        physics = importlib.import_module("gateway.physics")  # provided by the emulator package
        prof = physics.get_profile(profile)
        return _PhysicsAdapter(prof, ctx)
    except Exception as exc:
        if profile != DEFAULT_PROFILE:
            log.warning(
                "step profile %r unavailable (%s); using the built-in H200 Qwen3-8B table", profile, exc
            )
        return TableStepModel()
