"""Step-time profiles: how long one engine step takes on a given GPU.

A *step* is one forward pass of the target model over ``batch`` running sequences,
each verifying ``q`` tokens (``q = 1`` for plain decoding, ``q = k + 1`` for a
speculative step with ``k`` drafts) at a mean context of ``ctx`` tokens.

Profiles:

``h200-qwen3-8b``, ``h200-qwen3-32b``
    Interpolated from the H200 measurements shipped as package data
    (``data/h200-dense-steps.jsonl``): bilinear in (log2 batch, q) over the measured
    grid at 1024 context; the 4096-context rows give a per-token context slope (linear
    in context, proportional to batch past the grid, as KV reads are). Past the grid the
    step time is extrapolated linearly in batch and in q (the compute-bound regime) and
    clamped below at batch 1 / q 1.
``l4-qwen3-8b``
    A roofline for an NVIDIA L4 (300 GB/s, 121 dense bf16 TFLOP/s) with the Qwen3-8B
    shape: ``max(weights + KV bytes / bandwidth, FLOPs / peak) + fixed overhead``.

Every profile also prices the drafting work of model-based speculators
(:meth:`StepTimeProfile.draft_ms`) and the prefill of prompt tokens
(:meth:`StepTimeProfile.prefill_ms`). After the first load (cached) every call is O(1)
and does no I/O, so the routing core can use a profile as its prior for T(batch, q).
"""

from __future__ import annotations

import json
import math
from abc import ABC, abstractmethod
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from gateway.physics.methods import DRAFT_MODEL, NGRAM_METHODS, ONE_PASS_METHODS

BASE_CTX = 1024


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through (xs, ys); clamp below xs[0], extrapolate past xs[-1]."""
    if x <= xs[0]:
        return ys[0]
    n = len(xs)
    if x >= xs[-1]:
        if n == 1:
            return ys[0]
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        return ys[-1] + max(0.0, slope) * (x - xs[-1])
    i = bisect_right(xs, x) - 1
    t = (x - xs[i]) / (xs[i + 1] - xs[i])
    return ys[i] + t * (ys[i + 1] - ys[i])


@dataclass(frozen=True, slots=True)
class Grid:
    """A rectangular table ``ms[batch][q]``, interpolated in (log2 batch, q)."""

    batches: tuple[int, ...]
    qs: tuple[int, ...]
    ms: tuple[tuple[float, ...], ...]  # [batch index][q index]

    def at(self, batch: float, q: float) -> float:
        batch = max(1.0, batch)
        q = max(1.0, q)
        bs = self.batches
        qs = [float(v) for v in self.qs]
        rows = [_interp(qs, row, q) for row in self.ms]
        if batch >= bs[-1] and len(bs) > 1:
            # Past the grid: linear in batch (compute-bound), not in log2(batch).
            slope = (rows[-1] - rows[-2]) / (bs[-1] - bs[-2])
            return rows[-1] + max(0.0, slope) * (batch - bs[-1])
        lx = [math.log2(b) for b in bs]
        return _interp(lx, rows, math.log2(batch))


def _grid(rows: list[dict[str, Any]], model: str, ctx: int) -> Grid | None:
    table: dict[int, dict[int, float]] = {}
    for r in rows:
        if r["model"] == model and r["ctx"] == ctx:
            table.setdefault(int(r["batch"]), {})[int(r["q"])] = float(r["ms"])
    if not table:
        return None
    batches = tuple(sorted(table))
    qs = tuple(sorted(set.intersection(*(set(v) for v in table.values()))))
    return Grid(batches, qs, tuple(tuple(table[b][q] for q in qs) for b in batches))


@cache
def calibration_rows(name: str = "h200-dense-steps.jsonl") -> tuple[dict[str, Any], ...]:
    """The rows of one calibration file shipped in ``gateway/physics/data`` (read once)."""
    text = resources.files("gateway.physics").joinpath("data", name).read_text(encoding="utf-8")
    return tuple(json.loads(line) for line in text.splitlines() if line.strip())


def decode_grid(model: str = "qwen3-8b", ctx: int = BASE_CTX) -> Grid:
    """The measured step times of ``model`` at ``ctx`` context (ms by batch x q), as shipped."""
    grid = _grid(list(calibration_rows()), model, ctx)
    if grid is None:
        raise KeyError(f"no calibration rows for {model!r} at {ctx} context")
    return grid


class StepTimeProfile(ABC):
    """T(batch, q, ctx) for one target model on one GPU, plus drafting and prefill costs."""

    name: str
    model: str
    #: Host-side time of an n-gram/suffix proposer per step (ms), plus per sequence.
    cpu_proposer_ms: float = 0.15
    cpu_proposer_ms_per_seq: float = 0.004
    #: Host time a speculative engine adds to every decode step that a plain engine hides:
    #: rejection sampling and bookkeeping, with async scheduling off under speculation.
    spec_host_overhead_ms: float = 0.8
    #: Host time of each draft-model forward pass (input preparation, launches, no CUDA
    #: graph for the drafter). Fitted to real vLLM 0.20.2 on an H200, where a Qwen3-0.6B
    #: drafter (k=4, mean acceptance length 3.36) lost to the plain engine at every
    #: concurrency, while the pure forward steps alone say it should win at batch 1.
    draft_pass_overhead_ms: float = 3.0
    #: An EAGLE-style head's forward per draft token, as a share of one target step (about
    #: one decoder layer and the LM head).
    head_step_fraction: float = 0.07

    @abstractmethod
    def step_ms(self, batch: float, q: float = 1.0, ctx: float = BASE_CTX) -> float:
        """Milliseconds of one target-model step: ``batch`` sequences x ``q`` tokens each."""

    @abstractmethod
    def prefill_ms(self, tokens: int) -> float:
        """Extra milliseconds a step spends prefilling ``tokens`` prompt tokens."""

    @abstractmethod
    def small_model_step_ms(self, draft_model: str, batch: float, ctx: float = BASE_CTX) -> float:
        """One single-token step of a small draft model (``qwen3-0.6b`` or ``qwen3-1.7b``)."""

    def draft_ms(
        self, method: str, k: int, batch: float, ctx: float = BASE_CTX, draft_model: str | None = None
    ) -> float:
        """Milliseconds spent proposing ``k`` drafts for ``batch`` sequences with ``method``."""
        if k <= 0 or batch <= 0:
            return 0.0
        if method in NGRAM_METHODS:  # host-only lookup: no GPU work
            return self.cpu_proposer_ms + self.cpu_proposer_ms_per_seq * batch
        if method == DRAFT_MODEL:
            per_pass = self.small_model_step_ms(draft_model or "qwen3-0.6b", batch, ctx)
            return k * (per_pass + self.draft_pass_overhead_ms)
        # EAGLE-style heads: about one decoder layer + LM head of the target per draft token,
        # run k times (HEAD_METHODS, and any method not in the vocabulary) or once.
        head = self.head_step_fraction * self.step_ms(batch, 1.0, ctx)
        if method in ONE_PASS_METHODS:
            return head
        return k * head

    def per_token_ms(self, batch: float, q: float, tokens_per_step: float, ctx: float = BASE_CTX) -> float:
        """Time per output token when each step yields ``tokens_per_step`` tokens per sequence."""
        return self.step_ms(batch, q, ctx) / max(1.0, tokens_per_step)


class GridProfile(StepTimeProfile):
    """A profile interpolated from measured steps (see the module docstring)."""

    def __init__(
        self,
        name: str,
        model: str,
        grid: Grid,
        ctx_delta: Grid,
        ctx_delta_span: int,
        drafts: dict[str, Grid],
        ctx_scale: float = 1.0,
    ) -> None:
        self.name, self.model = name, model
        self._grid = grid
        self._ctx_delta = ctx_delta
        self._ctx_span = float(ctx_delta_span)
        self._drafts = drafts
        self._ctx_scale = ctx_scale
        # Marginal cost of one more token at the top of the grid: the compute-bound prefill rate.
        top_b = grid.batches[-1]
        q_hi, q_lo = grid.qs[-1], grid.qs[-2]
        self._prefill_per_token = (grid.at(top_b, q_hi) - grid.at(top_b, q_lo)) / (top_b * (q_hi - q_lo))

    def _ctx_extra(self, batch: float, q: float, ctx: float) -> float:
        d = self._ctx_delta
        top = d.batches[-1]
        if batch > top:
            per_seq = d.at(top, q) / top  # KV reads grow with batch past the grid
            delta = per_seq * batch
        else:
            delta = d.at(batch, q)
        return delta * self._ctx_scale * (ctx - BASE_CTX) / self._ctx_span

    def step_ms(self, batch: float, q: float = 1.0, ctx: float = BASE_CTX) -> float:
        base = self._grid.at(batch, q)
        return max(0.5 * base, base + self._ctx_extra(max(1.0, batch), max(1.0, q), ctx))

    def prefill_ms(self, tokens: int) -> float:
        return max(0, tokens) * self._prefill_per_token

    def small_model_step_ms(self, draft_model: str, batch: float, ctx: float = BASE_CTX) -> float:
        key = "qwen3-1.7b" if "1.7" in draft_model else "qwen3-0.6b"
        return self._drafts[key].at(batch, 1.0)


@dataclass(frozen=True, slots=True)
class ModelShape:
    params: float  # parameter count
    layers: int
    kv_heads: int
    head_dim: int
    q_heads: int

    @property
    def kv_bytes_per_token(self) -> float:
        return 2.0 * self.layers * self.kv_heads * self.head_dim * 2  # K and V, bf16


QWEN3_8B = ModelShape(params=8.19e9, layers=36, kv_heads=8, head_dim=128, q_heads=32)
QWEN3_32B = ModelShape(params=32.8e9, layers=64, kv_heads=8, head_dim=128, q_heads=64)
QWEN3_06B = ModelShape(params=0.6e9, layers=28, kv_heads=8, head_dim=128, q_heads=16)
QWEN3_17B = ModelShape(params=1.7e9, layers=28, kv_heads=8, head_dim=128, q_heads=16)


class RooflineProfile(StepTimeProfile):
    """``max(bytes / bandwidth, flops / peak) + overhead`` for a model shape on one GPU."""

    def __init__(
        self,
        name: str,
        model: str,
        shape: ModelShape,
        *,
        bandwidth_gbs: float,
        tflops: float,
        overhead_ms: float,
        mem_efficiency: float = 0.95,
        compute_efficiency: float = 0.75,
    ) -> None:
        self.name, self.model, self.shape = name, model, shape
        self._bw = bandwidth_gbs * 1e9 * mem_efficiency
        self._flops = tflops * 1e12 * compute_efficiency
        self._overhead = overhead_ms
        self.cpu_proposer_ms = 0.3  # a slower host beside a smaller card
        self.spec_host_overhead_ms = 1.0

    def _roofline_ms(self, shape: ModelShape, batch: float, q: float, ctx: float) -> float:
        batch, q, ctx = max(1.0, batch), max(1.0, q), max(1.0, ctx)
        tokens = batch * q
        read = shape.params * 2 + batch * ctx * shape.kv_bytes_per_token
        flops = 2 * shape.params * tokens + 4 * shape.layers * tokens * ctx * shape.q_heads * shape.head_dim
        return 1e3 * max(read / self._bw, flops / self._flops)

    def step_ms(self, batch: float, q: float = 1.0, ctx: float = BASE_CTX) -> float:
        return self._roofline_ms(self.shape, batch, q, ctx) + self._overhead

    def prefill_ms(self, tokens: int) -> float:
        return 1e3 * 2 * self.shape.params * max(0, tokens) / self._flops

    def small_model_step_ms(self, draft_model: str, batch: float, ctx: float = BASE_CTX) -> float:
        shape = QWEN3_17B if "1.7" in draft_model else QWEN3_06B
        return self._roofline_ms(shape, batch, 1.0, ctx) + 0.3 * self._overhead


def _h200(model: str, name: str, ctx_scale: float) -> GridProfile:
    rows = list(calibration_rows())
    grid = _grid(rows, model, BASE_CTX)
    base8 = _grid(rows, "qwen3-8b", BASE_CTX)
    long8 = _grid(rows, "qwen3-8b", 4096)
    d06, d17 = _grid(rows, "qwen3-0.6b", BASE_CTX), _grid(rows, "qwen3-1.7b", BASE_CTX)
    assert grid and base8 and long8 and d06 and d17, "calibration data incomplete"
    delta = Grid(
        long8.batches,
        long8.qs,
        tuple(
            tuple(max(0.0, long8.ms[i][j] - base8.at(b, q)) for j, q in enumerate(long8.qs))
            for i, b in enumerate(long8.batches)
        ),
    )
    return GridProfile(
        name, model, grid, delta, 4096 - BASE_CTX, {"qwen3-0.6b": d06, "qwen3-1.7b": d17}, ctx_scale
    )


MEASURED_PROFILES = ("h200-vllm-0.20.2-measured", "h200-vllm-0.26.0-measured")
PROFILE_NAMES = ("h200-qwen3-8b", "h200-qwen3-32b", "l4-qwen3-8b", *MEASURED_PROFILES)


def _measured(name: str) -> StepTimeProfile:
    """A named profile's host-time constants replaced by those measured on real engines
    (``data/<name>.json``: its ``base`` profile plus ``overrides`` of class attributes)."""
    text = resources.files("gateway.physics").joinpath("data", f"{name}.json").read_text(encoding="utf-8")
    data = json.loads(text)
    prof = _h200("qwen3-8b", name, 1.0) if data["base"] == "h200-qwen3-8b" else None
    if prof is None:
        raise KeyError(f"{name}: unsupported base profile {data['base']!r}")
    for key, value in data["overrides"].items():
        if not isinstance(getattr(StepTimeProfile, key, None), float):
            raise KeyError(f"{name}: {key!r} is not a tunable constant of StepTimeProfile")
        setattr(prof, key, float(value))
    return prof


@cache
def named_profile(name: str) -> StepTimeProfile:
    """A named profile (one of :data:`PROFILE_NAMES`), built once and cached (a fitted
    profile's file too: :func:`gateway.physics.get_profile`)."""
    if name == "h200-qwen3-8b":
        return _h200("qwen3-8b", name, 1.0)
    if name == "h200-qwen3-32b":
        # No long-context rows for 32B: scale the 8B context slope by the KV bytes per token.
        return _h200("qwen3-32b", name, QWEN3_32B.kv_bytes_per_token / QWEN3_8B.kv_bytes_per_token)
    if name in MEASURED_PROFILES:
        return _measured(name)
    if name == "l4-qwen3-8b":
        return RooflineProfile(name, "qwen3-8b", QWEN3_8B, bandwidth_gbs=300, tflops=121, overhead_ms=2.0)
    raise KeyError(
        f"unknown profile {name!r}; known: {', '.join(PROFILE_NAMES)}, or a fitted profile's .json"
    )
