"""A finished answer → the :class:`Outcome` the policy learns from.

The caller (the gateway's relay, or the simulator's engine events) describes what it saw
as an :class:`Answer`; the realised prompt-lookup replay uses the lookup settings of the
pair that served the answer (:class:`LookupSettings`).
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.routing.adaptive import LOOKUP_DRAFTS_KEY
from gateway.routing.overlap import realised_lookup_rates, realised_lookup_stats
from gateway.routing.types import Outcome, RequestFeatures, Route
from gateway.text import LookupStats


@dataclass(frozen=True, slots=True)
class Answer:
    """What the caller observed of one answer (times in seconds on one clock)."""

    route: Route
    engine: str
    ok: bool
    started: float  # when the request arrived
    first_token_at: float | None
    last_token_at: float | None
    completion_tokens: int
    prompt_tokens: int | None = None  # as the engine reported (usage); None: the features' estimate
    reported_acceptance_rate: float | None = None
    reported_mean_acceptance_length: float | None = None
    retried: bool = False
    # Engine emissions (stream deltas) that carried tokens; None when unknown (non-stream).
    steps: int | None = None


@dataclass(frozen=True, slots=True)
class LookupSettings:
    """The n-gram proposer settings to replay an answer with (the serving pair's)."""

    k: int = 5
    n_min: int = 5
    n_max: int = 5

    def __post_init__(self) -> None:
        if self.k < 1 or not 1 <= self.n_min <= self.n_max:
            raise ValueError("need k >= 1 and 1 <= prompt_lookup_min <= prompt_lookup_max")

    @classmethod
    def of(cls, k: int, n_min: int | None, n_max: int | None) -> LookupSettings:
        """From an engine's declared config (unset sizes: vLLM's default 5; k at least 1)."""
        return cls(max(1, k), n_min or 5, n_max or 5)


def replay_lookup(
    prompt_text: str, completion_text: str, settings: LookupSettings
) -> tuple[float, float] | None:
    """(acceptance per step ÷ k, draft tokens per step) an n-gram proposer would have realised."""
    return realised_lookup_rates(
        prompt_text, completion_text, k=settings.k, n_min=settings.n_min, n_max=settings.n_max
    )


def replay_lookup_stats(
    prompt_text: str, completion_text: str, settings: LookupSettings
) -> tuple[LookupStats, int] | None:
    """The proposer's counters over the answer, and the prompt's length in word pieces."""
    return realised_lookup_stats(
        prompt_text, completion_text, k=settings.k, n_min=settings.n_min, n_max=settings.n_max
    )


def build_outcome(
    features: RequestFeatures,
    answer: Answer,
    *,
    probe: bool,
    lookup: tuple[float, float] | None = None,
    predicted_tpot_s: float | None = None,
) -> Outcome:
    """The outcome of one answer; ``lookup`` is :func:`replay_lookup`'s result when computed."""
    n = answer.completion_tokens
    ttft = answer.first_token_at - answer.started if answer.first_token_at is not None else None
    tpot = None
    if answer.first_token_at is not None and answer.last_token_at is not None and n > 1:
        tpot = (answer.last_token_at - answer.first_token_at) / (n - 1)
    extra: dict[str, float] = {}
    if answer.retried:
        extra["retried"] = 1.0
    if lookup is not None:
        extra[LOOKUP_DRAFTS_KEY] = lookup[1]
    return Outcome(
        model=features.model,
        route=answer.route,
        engine=answer.engine,
        kind=features.kind,
        temperature=features.temperature,
        ok=answer.ok,
        prompt_tokens=answer.prompt_tokens if answer.prompt_tokens is not None else features.prompt_tokens,
        completion_tokens=n,
        ttft_s=ttft,
        tpot_s=tpot,
        lookup_acceptance=None if lookup is None else lookup[0],
        reported_acceptance_rate=answer.reported_acceptance_rate,
        reported_mean_acceptance_length=answer.reported_mean_acceptance_length,
        probe=probe,
        steps=answer.steps,
        predicted_tpot_s=predicted_tpot_s,
        extra=extra,
    )
