"""Replays aggregated per class, and what a speculative engine would do with them.

Per class (the gateway's request kind and temperature bucket) and over all: the share of
steps that would carry a draft, the acceptance rate of the drafted tokens, the mean
acceptance length as vLLM reports it (over drafted steps), and the tokens each step
would emit over the whole answers. The prediction prices both engines on the step-time
profile (:mod:`gateway.routing.adaptive.costmodel`, as the router does) at each load
(requests in flight on the engine), read at the traffic's own context: the plain
engine's time per token, the speculative one's (its step verifying the drafts, divided
by the tokens per step, a harmonic mean over requests), hence the speed-up; and the load
above which speculation turns into a slowdown, with the request rate that load means on
the plain engine (Little's law over the answers' decoding, queueing and prefill left out).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.advisor.replay import Replay
from gateway.pipeline.outcome import LookupSettings
from gateway.routing.acceptance import TEMP_BUCKETS
from gateway.routing.adaptive.costmodel import regime_costs
from gateway.routing.steptime import StepModel
from gateway.text import LookupStats
from gateway.text.suffix import AnswerCache, SuffixSettings

MAX_LOAD = 1024  # the break-even search stops here
MEASURED = 256  # plain answers whose measured time per token the live advice keeps


def bucket_edges(b: int) -> tuple[float | None, float | None]:
    """(lower, upper) temperature of a bucket (:data:`TEMP_BUCKETS`); None: open."""
    lo = TEMP_BUCKETS[b - 1] if b > 0 else None
    hi = TEMP_BUCKETS[b] if b < len(TEMP_BUCKETS) else None
    return lo, hi


def bucket_label(b: int) -> str:
    """A temperature bucket as a range, e.g. ``T ≤ 0.05`` or ``0.35 < T ≤ 0.75``."""
    lo, hi = bucket_edges(b)
    if lo is None:
        return f"T ≤ {hi:g}"
    return f"{lo:g} < T ≤ {hi:g}" if hi is not None else f"T > {lo:g}"


@dataclass
class ClassStats:
    """What the proposer would have done over one class's answers: the replays' summed
    counters (their acceptance rate, mean acceptance length and tokens per step are
    :class:`~gateway.text.LookupStats`'), and what pricing the class needs besides."""

    requests: int = 0
    counts: LookupStats = field(default_factory=lambda: LookupStats(0, 0, 0, 0, 0))
    prompt_tokens: int = 0
    inv_tokens_per_step: float = 0.0  # Σ over requests of steps ÷ tokens
    held: float = 0.0  # Σ L·(P + L/2): the context a batch holds, answer-weighted

    def add(self, prompt_tokens: int, st: LookupStats) -> None:
        self.requests += 1
        self.counts += st
        self.prompt_tokens += prompt_tokens
        self.inv_tokens_per_step += st.steps / st.output_tokens
        self.held += st.output_tokens * (prompt_tokens + st.output_tokens / 2.0)

    @property
    def tokens(self) -> int:
        """Answer tokens."""
        return self.counts.output_tokens

    @property
    def acceptance_rate(self) -> float | None:
        return self.counts.acceptance_rate

    @property
    def mean_acceptance_length(self) -> float | None:
        """As vLLM's ``mean_acceptance_length``: over drafted steps."""
        return self.counts.mean_acceptance_length

    @property
    def tokens_per_step(self) -> float:
        """Answer tokens per engine step, drafted or not."""
        return self.counts.tokens_per_step

    @property
    def drafted_share(self) -> float:
        c = self.counts
        return c.drafts / c.steps if c.steps else 0.0

    @property
    def mean_inverse_tokens_per_step(self) -> float:
        return self.inv_tokens_per_step / self.requests if self.requests else 1.0

    @property
    def verified_per_step(self) -> float:
        """Tokens a step verifies per sequence: 1 + the drafts (what the step costs)."""
        c = self.counts
        return 1.0 + c.draft_tokens / c.steps if c.steps else 1.0

    @property
    def context_tokens(self) -> float:
        return self.held / self.tokens if self.tokens else 0.0


@dataclass(frozen=True, slots=True)
class Prediction:
    load: float
    base_ms: float  # time per output token, plain engine
    spec_ms: float  # the same, speculative engine
    requests_per_s: float  # the load's arrival rate on the plain engine (decoding only)

    @property
    def speedup(self) -> float:
        return self.base_ms / self.spec_ms if self.spec_ms > 0 else 1.0


@dataclass
class ProposerAdvice:
    """One proposer's replays per class and over all, and both engines priced on them
    (``k``: the most tokens one of its steps drafts)."""

    method: str  # "ngram" or "suffix", as vLLM names them
    k: int
    total: ClassStats = field(default_factory=ClassStats)
    classes: dict[tuple[str, int], ClassStats] = field(default_factory=dict)

    def add(self, kind: str, bucket: int, prompt_tokens: int, stats: LookupStats) -> None:
        self.total.add(prompt_tokens, stats)
        self.classes.setdefault((kind, bucket), ClassStats()).add(prompt_tokens, stats)

    def predict(
        self, steps: StepModel, loads: Iterable[float], stats: ClassStats | None = None
    ) -> list[Prediction]:
        """Both engines priced at each load for ``stats`` (default: all the traffic)."""
        s = stats or self.total
        mean_tokens = s.tokens / s.requests if s.requests else 1.0
        out = []
        for b in loads:
            c = regime_costs(
                steps,
                load=b,
                q_spec=s.verified_per_step,
                inv_tokens_per_step=s.mean_inverse_tokens_per_step,
                method=self.method,
                k=self.k,
                prefill_per_token=s.prompt_tokens / s.tokens if s.tokens else 0.0,
            )
            qps = b / (mean_tokens * c.base_ms / 1000.0) if c.base_ms > 0 else 0.0
            out.append(Prediction(float(b), c.base_ms, c.spec_ms, qps))
        return out

    def break_even(self, steps: StepModel, stats: ClassStats | None = None) -> Prediction | None:
        """The smallest load (requests in flight) where speculation stops paying, up to
        :data:`MAX_LOAD`; None if it pays up to there."""
        for p in self.predict(steps, _grid(), stats):
            if p.speedup < 1.0:
                return p
        return None


def _grid() -> Sequence[int]:
    """Every load to 64, then every 8th to 256, then every 32nd."""
    return [*range(1, 65), *range(72, 257, 8), *range(288, MAX_LOAD + 1, 32)]


@dataclass
class Advice:
    """What the advisor knows of a model's traffic: each answer replayed through vLLM's
    n-gram proposer (``settings``) and, with ``suffix`` settings, a suffix-decoding one that
    also drafts from the earlier answers (``answers``, bounded)."""

    settings: LookupSettings
    suffix: SuffixSettings | None = None
    skipped: int = 0  # records that were not a request with a usable answer
    ngram: ProposerAdvice = field(init=False)
    suffix_advice: ProposerAdvice | None = field(init=False)
    answers: AnswerCache | None = field(init=False)
    # Held while a suffix replay reads and extends ``answers`` (replays run in threads).
    lock: threading.Lock = field(init=False, default_factory=threading.Lock)
    # (time per output token in s, requests in flight) of the plain engine's latest answers
    measured: deque[tuple[float, float]] = field(init=False, default_factory=lambda: deque(maxlen=MEASURED))

    def __post_init__(self) -> None:
        self.ngram = ProposerAdvice("ngram", self.settings.k)
        sx = self.suffix
        self.suffix_advice = None if sx is None else ProposerAdvice("suffix", sx.k)
        self.answers = None if sx is None else AnswerCache(sx.max_cached_requests)

    @property
    def requests(self) -> int:
        return self.ngram.total.requests

    def add(self, r: Replay | None) -> None:
        if r is None:
            self.skipped += 1
            return
        self.ngram.add(r.kind, r.bucket, r.prompt_tokens, r.stats)
        if self.suffix_advice is not None and r.suffix is not None:
            self.suffix_advice.add(r.kind, r.bucket, r.prompt_tokens, r.suffix)

    def observe_plain(self, tpot_s: float, in_flight: float) -> None:
        """A plain answer's measured time per output token, at the load it ran under."""
        if tpot_s > 0 and math.isfinite(tpot_s) and in_flight >= 1:
            self.measured.append((tpot_s, in_flight))

    def proposers(self) -> list[ProposerAdvice]:
        return [self.ngram] if self.suffix_advice is None else [self.ngram, self.suffix_advice]


def _proposer_dict(pa: ProposerAdvice, steps: StepModel, loads: Iterable[float]) -> dict[str, Any]:
    def cls(s: ClassStats) -> dict[str, Any]:
        be = pa.break_even(steps, s)
        return {
            "requests": s.requests,
            "answer_tokens": s.tokens,
            "drafted_share": s.drafted_share,
            "acceptance_rate": s.acceptance_rate,
            "mean_acceptance_length": s.mean_acceptance_length,
            "tokens_per_step": s.tokens_per_step,
            "break_even_load": None if be is None else be.load,
        }

    return {
        "all": cls(pa.total),
        "classes": [
            {"kind": k, "temperature": bucket_label(b), **cls(s)} for (k, b), s in sorted(pa.classes.items())
        ],
        "predictions": [
            {
                "load": p.load,
                "requests_per_s": p.requests_per_s,
                "plain_ms": p.base_ms,
                "spec_ms": p.spec_ms,
                "speedup": p.speedup,
            }
            for p in pa.predict(steps, loads)
        ],
    }


def measured_dict(adv: Advice, steps: StepModel) -> dict[str, Any] | None:
    """The plain engine as measured (its latest answers' mean time per output token and the
    mean load they ran under) and each proposer's predicted time per token at that load,
    from the profile and scaled by how the measured plain engine compares with it."""
    if not adv.measured:
        return None
    plain_ms = 1000.0 * sum(t for t, _ in adv.measured) / len(adv.measured)
    load = sum(n for _, n in adv.measured) / len(adv.measured)
    out: dict[str, Any] = {"answers": len(adv.measured), "in_flight": load, "plain_ms": plain_ms}
    for pa in adv.proposers():
        [p] = pa.predict(steps, [load])
        out[pa.method] = {
            "profile_plain_ms": p.base_ms,
            "profile_spec_ms": p.spec_ms,
            "spec_ms": p.spec_ms * plain_ms / p.base_ms if p.base_ms > 0 else None,
            "speedup": p.speedup,
        }
    return out


def advice_dict(adv: Advice, steps: StepModel, loads: Iterable[float], profile: str) -> dict[str, Any]:
    """The advice as JSON: settings, per class and over all what the n-gram proposer would
    accept and where speculation stops paying, both engines priced at ``loads``; the same
    for the suffix proposer under ``suffix``."""
    loads = list(loads)
    out: dict[str, Any] = {
        "settings": {
            "k": adv.settings.k,
            "prompt_lookup_min": adv.settings.n_min,
            "prompt_lookup_max": adv.settings.n_max,
            "profile": profile,
        },
        "skipped": adv.skipped,
        **_proposer_dict(adv.ngram, steps, loads),
    }
    if adv.suffix is not None and adv.suffix_advice is not None:
        sx = adv.suffix
        out["suffix"] = {
            "settings": {
                "k": sx.k,
                "max_tree_depth": sx.depth,
                "max_spec_factor": sx.max_spec_factor,
                "min_token_prob": sx.min_token_prob,
                "max_cached_requests": sx.max_cached_requests,
            },
            **_proposer_dict(adv.suffix_advice, steps, loads),
        }
    return out
