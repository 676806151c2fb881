"""Step-time prior T(batch, q): milliseconds for one engine step of ``batch`` sequences
each verifying ``q`` tokens (q = k + 1 on a speculative engine, 1 on a plain one).

The calibration profiles live in :mod:`gateway.physics` (``get_profile(name)`` with
``step_ms(batch, q, ctx)``). This module adapts one to the routing core. For a profile
name it does not know it falls back to :class:`TableStepModel` over the H200 Qwen3-8B
decode grid of ``gateway/physics/data`` (read through :func:`gateway.physics.decode_grid`),
so the decision core never fails for want of a profile. The router treats it as a *prior*
and corrects it online with measured step times (:mod:`gateway.routing.adaptive.live`) and measured
time per token (:mod:`gateway.routing.adaptive.calibration`).
"""

from __future__ import annotations

import bisect
import logging
from functools import cache
from typing import Protocol

from gateway import physics
from gateway.physics import StepTimeProfile
from gateway.physics.methods import NGRAM_METHODS

log = logging.getLogger(__name__)

DEFAULT_PROFILE = "h200-qwen3-8b"

Table = tuple[tuple[float, ...], ...]


@cache
def _h200_qwen3_8b() -> tuple[tuple[int, ...], tuple[int, ...], Table]:
    """H200, Qwen3-8B, 1024-token context, CUDA-graph replay: ms per step by (batch, q).

    The fallback has always read the grid at 0.01 ms resolution (far inside the spread of
    the measurements); rounded here so that it keeps giving the same numbers."""
    g = physics.decode_grid("qwen3-8b", 1024)
    return g.batches, g.qs, tuple(tuple(round(ms, 2) for ms in row) for row in g.ms)


class StepModel(Protocol):
    def step_ms(self, batch: float, q: float) -> float:
        """One target-model step: ``batch`` sequences verifying ``q`` tokens each."""
        ...

    def spec_extra_ms(self, method: str, k: int, batch: float) -> float:
        """Drafting and host overhead a speculative engine adds to each step."""
        ...

    def prefill_ms_per_token(self) -> float:
        """What one prompt token prefilled inside a step adds to it (compute-bound)."""
        ...


# Host time a speculative engine adds per step (rejection sampling, bookkeeping, async
# scheduling off) and the n-gram proposer's own time, when no profile says otherwise.
_SPEC_HOST_MS = StepTimeProfile.spec_host_overhead_ms
_NGRAM_PROPOSER_MS = StepTimeProfile.cpu_proposer_ms
_NGRAM_PROPOSER_MS_PER_SEQ = StepTimeProfile.cpu_proposer_ms_per_seq


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
        batches: tuple[int, ...] | None = None,
        qs: tuple[int, ...] | None = None,
        table: Table | None = None,
    ) -> None:
        """A grid of ``table[batch index][q index]``; by default the H200 Qwen3-8B one."""
        dflt_b, dflt_q, dflt_t = _h200_qwen3_8b()
        self.batches = dflt_b if batches is None else batches
        self.qs = dflt_q if qs is None else qs
        self.table = dflt_t if table is None else table

    def step_ms(self, batch: float, q: float) -> float:
        if batch <= 0:
            return 0.0
        bi, bj, bw = _interp(self.batches, batch)
        qi, qj, qw = _interp(self.qs, q)
        t = self.table

        def row(r: int) -> float:
            return t[r][qi] * (1 - qw) + t[r][qj] * qw

        return max(0.1, row(bi) * (1 - bw) + row(bj) * bw)

    def prefill_ms_per_token(self) -> float:
        """The marginal cost of one more token at the top of the grid."""
        top, t = self.batches[-1], self.table[-1]
        return max(0.0, (t[-1] - t[-2]) / (top * (self.qs[-1] - self.qs[-2])))

    def spec_extra_ms(self, method: str, k: int, batch: float) -> float:
        b = max(batch, 1.0)
        if method in NGRAM_METHODS:
            return _SPEC_HOST_MS + _NGRAM_PROPOSER_MS + _NGRAM_PROPOSER_MS_PER_SEQ * b
        # Model drafters: roughly one small step per draft token (~7 % of a target step).
        return _SPEC_HOST_MS + 0.07 * k * self.step_ms(b, 1.0)


class _PhysicsAdapter:
    """A :mod:`gateway.physics` profile, memoised on a (batch, q) grid of quarter steps."""

    def __init__(self, profile: StepTimeProfile, ctx: int) -> None:
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

    def prefill_ms_per_token(self) -> float:
        return float(self._p.prefill_ms(1000)) / 1000.0

    def spec_extra_ms(self, method: str, k: int, batch: float) -> float:
        b = max(batch, 1.0)
        host = float(getattr(self._p, "spec_host_overhead_ms", _SPEC_HOST_MS))
        try:
            return host + float(self._p.draft_ms(method, max(k, 1), b, self._ctx))
        except Exception:
            return host + _NGRAM_PROPOSER_MS


def get_step_model(profile: str = DEFAULT_PROFILE, ctx: int = 1024) -> StepModel:
    """The named calibration profile from :mod:`gateway.physics`, or the built-in table."""
    try:
        return _PhysicsAdapter(physics.get_profile(profile), ctx)
    except Exception as exc:
        if profile != DEFAULT_PROFILE:
            log.warning(
                "step profile %r unavailable (%s); using the built-in H200 Qwen3-8B table", profile, exc
            )
        return TableStepModel()
