"""Fit a :class:`~gateway.physics.fitted.FittedProfile` to measured windows of steps.

A :class:`Window` is what an engine's ``/metrics`` say about the steps of a few seconds:
its mean step time, decoding sequences per step, tokens verified per step, prompt tokens
prefilled per step and mean context (see :mod:`gateway.calibrate.windows` for how they
are read off vLLM's counters). :func:`fit_windows` finds the parameters of the model in
:mod:`gateway.physics.fitted` that minimise the squared *relative* error over the
windows: linear least squares for each candidate knee (the windows' own token counts),
non-negative by an active set (a negative cost is dropped and the rest refitted), the
best knee kept. Pure Python, no I/O.

Terms the windows cannot identify are not fitted and are reported as such: the spec
terms without speculative windows, the per-sequence drafting cost without speculative
windows over a range of batch sizes, the context slope without a range of contexts,
the knee without windows on both sides of it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.physics.fitted import FitParams, FitReport, FittedProfile

#: columns of the linear model, in order (see :class:`FitParams`)
COLUMNS = ("base_ms", "token_ms", "knee_ms", "kv_ms", "spec_host_overhead_ms", "spec_per_seq_ms")
MIN_WINDOWS = 4
MIN_SPREAD = 1.5  # max/min of a regressor below which its slope is not identifiable
MIN_Q_SPREAD = 1.25  # tokens verified per sequence: plain 1, speculative at least this
KV_UNIT = 1000.0  # kv_ms is per sequence per thousand tokens of context


@dataclass(frozen=True, slots=True)
class Window:
    """Steps of one engine over a few seconds, as its metrics report them."""

    spec: bool
    step_ms: float  # mean time of a step (inter-token latency of the decoding sequences)
    batch: float  # decoding sequences per step
    verify_tokens: float  # tokens verified per step: batch plus drafts (batch on a plain engine)
    prefill_tokens: float = 0.0  # prompt tokens computed per step
    ctx: float = float(1024)  # mean context of the decoding sequences
    weight: float = 1.0  # e.g. the window's steps

    @property
    def tokens(self) -> float:
        return self.verify_tokens + self.prefill_tokens

    @property
    def q(self) -> float:
        return self.verify_tokens / max(1e-9, self.batch)


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting (None if singular)."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-12:
            return None
        m[col], m[piv] = m[piv], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            if f:
                for c in range(col, n + 1):
                    m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x


def _row(w: Window, knee: float) -> list[float]:
    """The model's columns, as :class:`FittedProfile` prices a step: the knee on the tokens
    verified, the prompt tokens prefilled at the compute-bound slope (both slopes)."""
    s = 1.0 if w.spec else 0.0
    v, p = w.verify_tokens, w.prefill_tokens
    return [1.0, v + p, max(0.0, v - knee) + p, w.batch * w.ctx / KV_UNIT, s, s * w.batch]


def _lstsq(windows: Sequence[Window], knee: float, active: list[int]) -> list[float] | None:
    """Non-negative weighted least squares of the relative error over ``active`` columns."""
    cols = list(active)
    while cols:
        k = len(cols)
        ata = [[0.0] * k for _ in range(k)]
        atb = [0.0] * k
        for w in windows:
            full = _row(w, knee)
            r = [full[c] / w.step_ms for c in cols]  # divide by T: relative error
            for i in range(k):
                atb[i] += w.weight * r[i]  # target T / T = 1
                for j in range(k):
                    ata[i][j] += w.weight * r[i] * r[j]
        for i in range(k):
            ata[i][i] += 1e-12 * (ata[i][i] or 1.0)
        x = _solve(ata, atb)
        if x is None:
            return None
        worst = min(range(k), key=lambda i: x[i])
        if x[worst] >= 0 or cols[worst] == 0:
            out = [0.0] * len(COLUMNS)
            for c, v in zip(cols, x, strict=True):
                out[c] = max(0.0, v)
            return out
        cols.pop(worst)  # a negative cost: drop it, refit the rest
    return None


def _spread(values: Sequence[float]) -> float:
    lo, hi = min(values), max(values)
    return hi / lo if lo > 0 else math.inf if hi > 0 else 1.0


def _errors(windows: Sequence[Window], x: list[float], knee: float) -> list[float]:
    return [sum(c * v for c, v in zip(_row(w, knee), x, strict=True)) / w.step_ms - 1.0 for w in windows]


def fit_windows(
    windows: Sequence[Window],
    *,
    name: str = "fitted",
    model: str = "",
    spec_k: int = 0,
    spec_method: str = "",
) -> FittedProfile:
    """The :class:`FittedProfile` that best reproduces ``windows`` (relative error).

    Raises ValueError with fewer than :data:`MIN_WINDOWS` plain windows or no spread of
    batch sizes among them (a fit from one load says nothing about another)."""
    ws = [w for w in windows if w.step_ms > 0 and w.batch > 0 and w.weight > 0]
    plain = [w for w in ws if not w.spec]
    spec = [w for w in ws if w.spec]
    if len(plain) < MIN_WINDOWS:
        raise ValueError(f"{len(plain)} usable windows of the plain engine; at least {MIN_WINDOWS} needed")
    if _spread([w.batch for w in plain]) < MIN_SPREAD:
        raise ValueError("the plain engine ran at one batch size only: drive it over a range of loads")
    ctxs = [w.ctx for w in ws]
    wsum = sum(w.weight for w in ws)
    ctx_ref = sum(w.weight * w.ctx for w in ws) / wsum
    active = [0, 1, 2, 3, 4, 5]
    dropped: list[str] = []
    qs = [w.q for w in spec]
    # per-sequence (KV) and per-token costs part only where tokens per sequence or the
    # context vary: a speculative engine's drafts, or a range of contexts
    if _spread(ctxs) < MIN_SPREAD and (not spec or min(qs) < MIN_Q_SPREAD):
        active.remove(3)
        dropped.append("kv_ms")
    if not spec:
        active.remove(4)
        dropped.append("spec_host_overhead_ms")
    # the drafter's per-sequence cost parts from the verification's only where the
    # speculative engine's tokens per sequence vary (else it is read as verification)
    if not spec or _spread([w.batch for w in spec]) < MIN_SPREAD or _spread(qs) < MIN_Q_SPREAD:
        active.remove(5)
        dropped.append("spec_per_seq_ms")
    tokens = sorted({round(w.verify_tokens, 6) for w in ws})
    knees = [0.0] + [t for t in tokens[1:-1] if sum(1 for w in ws if w.verify_tokens > t) >= 2]
    best: tuple[float, list[float], float] | None = None
    for knee in knees:
        cols = active if knee > 0 else [c for c in active if c != 2]
        x = _lstsq(ws, knee, cols)
        if x is None:
            continue
        sse = sum(w.weight * e * e for w, e in zip(ws, _errors(ws, x, knee), strict=True))
        if best is None or sse < best[2] - 1e-15:
            best = (knee, x, sse)
    if best is None:
        raise ValueError("the windows admit no fit (singular): drive the engines over a range of loads")
    knee, x, _ = best
    if x[2] == 0.0:
        knee = 0.0
        dropped.append("knee_ms")
    errs = _errors(ws, x, knee)
    params = FitParams(
        base_ms=x[0],
        token_ms=x[1],
        knee_ms=x[2],
        knee_tokens=knee,
        kv_ms=x[3],
        ctx_ref=ctx_ref,
        spec_host_overhead_ms=x[4],
        spec_per_seq_ms=x[5],
        spec_k=spec_k,
        spec_method=spec_method,
    )
    report = FitReport(
        windows=len(ws),
        windows_spec=len(spec),
        batch_range=(min(w.batch for w in ws), max(w.batch for w in ws)),
        tokens_range=(min(w.tokens for w in ws), max(w.tokens for w in ws)),
        ctx_range=(min(ctxs), max(ctxs)),
        rms_rel_error=math.sqrt(sum(w.weight * e * e for w, e in zip(ws, errs, strict=True)) / wsum),
        max_rel_error=max(abs(e) for e in errs),
        not_fitted=tuple(dropped),
    )
    return FittedProfile(name, model, params, report)
