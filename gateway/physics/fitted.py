"""A step-time profile fitted to an engine pair's own metrics (``specgate profile-fit``).

The fitted model of one step, for ``batch`` sequences verifying ``q`` tokens each
(``N = batch x q`` tokens) at a mean context of ``ctx`` tokens, prefilling ``P`` prompt
tokens::

    T = base_ms + token_ms * N + knee_ms * max(0, N - knee_tokens)
        + kv_ms * batch * ctx / 1000 + (token_ms + knee_ms) * P

a memory-bound floor that grows slowly with the tokens of a step, a steeper slope past
the knee where the step turns compute-bound, and each sequence's reads of its context
(KV cache and attention: ``kv_ms`` per sequence per thousand tokens). ``ctx_ref`` is the
mean context of the fit. A speculative engine's step adds
``spec_host_overhead_ms + spec_per_seq_ms * batch`` (host work and drafting, as one).
Prefill is priced at the compute-bound slope (``token_ms + knee_ms`` per token).

A profile file is JSON (:meth:`FittedProfile.to_json`); ``routing.profile`` and the
emulator's ``--profile`` accept its path wherever they accept a profile's name.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gateway.physics.methods import NGRAM_METHODS
from gateway.physics.profile import BASE_CTX, StepTimeProfile

FORMAT = "specgate-fitted-profile/1"


@dataclass(frozen=True, slots=True)
class FitParams:
    """The parameters of :class:`FittedProfile` (ms, tokens)."""

    base_ms: float
    token_ms: float
    knee_ms: float = 0.0
    knee_tokens: float = 0.0
    kv_ms: float = 0.0
    ctx_ref: float = float(BASE_CTX)
    spec_host_overhead_ms: float = 0.0
    spec_per_seq_ms: float = 0.0
    #: the speculative engine's drafts per step at the fit (scales a model drafter's cost)
    spec_k: int = 0
    spec_method: str = ""

    def step_ms(self, batch: float, q: float, ctx: float) -> float:
        b, q = max(1.0, batch), max(1.0, q)
        n = b * q
        t = self.base_ms + self.token_ms * n + self.knee_ms * max(0.0, n - self.knee_tokens)
        t += self.kv_ms * b * max(1.0, ctx) / 1000.0
        return max(0.5 * self.base_ms, t)

    def spec_extra_ms(self, batch: float) -> float:
        return self.spec_host_overhead_ms + self.spec_per_seq_ms * max(1.0, batch)


@dataclass(frozen=True, slots=True)
class FitReport:
    """What a fit saw and how well its model reproduces it (stored beside the parameters)."""

    windows: int
    windows_spec: int
    batch_range: tuple[float, float]
    tokens_range: tuple[float, float]
    ctx_range: tuple[float, float]
    #: root-mean-square and worst relative error of the fit over its own windows
    rms_rel_error: float
    max_rel_error: float
    #: what the data could not pin down (fixed at 0 instead of fitted)
    not_fitted: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)


class FittedProfile(StepTimeProfile):
    """A :class:`StepTimeProfile` from :class:`FitParams` (see the module docstring)."""

    def __init__(self, name: str, model: str, params: FitParams, report: FitReport | None = None) -> None:
        self.name, self.model, self.params, self.report = name, model, params, report
        self.spec_host_overhead_ms = params.spec_host_overhead_ms
        self.cpu_proposer_ms = 0.0  # inside spec_host_overhead_ms: a fit cannot tell them apart
        self.cpu_proposer_ms_per_seq = 0.0

    def step_ms(self, batch: float, q: float = 1.0, ctx: float = BASE_CTX) -> float:
        return self.params.step_ms(batch, q, ctx)

    def prefill_ms(self, tokens: int) -> float:
        return max(0, tokens) * (self.params.token_ms + self.params.knee_ms)

    def small_model_step_ms(self, draft_model: str, batch: float, ctx: float = BASE_CTX) -> float:
        # Not measured by a fit: a tenth of a target step (the 0.6B/8B ratio of the H200 grid).
        return 0.1 * self.step_ms(batch, 1.0, ctx)

    def draft_ms(
        self, method: str, k: int, batch: float, ctx: float = BASE_CTX, draft_model: str | None = None
    ) -> float:
        """The fitted per-sequence drafting cost; a model drafter's scaled by ``k`` over the
        fit's ``k`` (n-gram lookup does not grow with ``k``)."""
        if k <= 0 or batch <= 0:
            return 0.0
        p = self.params
        per_seq = p.spec_per_seq_ms * batch
        if method not in NGRAM_METHODS and p.spec_k > 0:
            per_seq *= k / p.spec_k
        return per_seq

    def to_json(self) -> str:
        doc: dict[str, Any] = {
            "format": FORMAT,
            "name": self.name,
            "model": self.model,
            "params": asdict(self.params),
        }
        if self.report is not None:
            doc["report"] = asdict(self.report)
        return json.dumps(doc, indent=2) + "\n"


def load_fitted(path: str | Path) -> FittedProfile:
    """A profile written by ``specgate profile-fit`` (raises ValueError on another file)."""
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not a fitted step-time profile (format {FORMAT!r} expected)")
    params = FitParams(**doc["params"])
    rep = doc.get("report")
    report = None
    if isinstance(rep, dict):
        for key in ("batch_range", "tokens_range", "ctx_range", "not_fitted", "notes"):
            if key in rep:
                rep[key] = tuple(rep[key])
        report = FitReport(**rep)
    return FittedProfile(str(doc.get("name", Path(path).stem)), str(doc.get("model", "")), params, report)
