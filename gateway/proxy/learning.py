"""After a response: build the :class:`Outcome` and feed it to the policy. Never fails a request."""

from __future__ import annotations

import asyncio
import logging
import time

from gateway.engines.runtime import ModelRuntime
from gateway.proxy.result import ProxyResult
from gateway.routing.adaptive import LOOKUP_DRAFTS_KEY
from gateway.routing.overlap import realised_lookup_rates
from gateway.routing.types import Decision, Outcome, RequestFeatures

log = logging.getLogger(__name__)

INLINE_LOOKUP_CHARS = 8 * 1024  # prompt+completion below this: compute on the loop
# Realised-lookup computations per second per model, at most (each costs ~0.1-0.5 ms of CPU
# for answers of a few hundred tokens); the burst lets low-traffic gateways learn from every answer.
LOOKUP_SAMPLES_PER_S = 5.0
LOOKUP_BURST = 20.0


class SampleBudget:
    """Token bucket bounding how often the (CPU-costly) realised lookup is computed, so
    learning stays a small, fixed share of the gateway's CPU at any request rate."""

    def __init__(self, rate: float = LOOKUP_SAMPLES_PER_S, burst: float = LOOKUP_BURST) -> None:
        self.rate = rate
        self.burst = max(1.0, burst)
        self.tokens = self.burst
        self.last = time.monotonic()

    def take(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


def build_outcome(
    features: RequestFeatures,
    decision: Decision,
    result: ProxyResult,
    *,
    started: float,
    lookup_acceptance: float | None,
    lookup_drafts_per_step: float | None = None,
) -> Outcome | None:
    if result.engine is None or result.route is None:
        return None
    h = result.harvest
    completion = h.completion_tokens if h.completion_tokens is not None else h.content_events
    ttft = result.first_token_at - started if result.first_token_at is not None else None
    tpot = None
    if result.first_token_at is not None and result.last_token_at is not None and completion > 1:
        tpot = (result.last_token_at - result.first_token_at) / (completion - 1)
    return Outcome(
        model=features.model,
        route=result.route,
        engine=result.engine,
        kind=features.kind,
        temperature=features.temperature,
        ok=result.ok,
        prompt_tokens=h.prompt_tokens if h.prompt_tokens is not None else features.prompt_tokens,
        completion_tokens=completion,
        ttft_s=ttft,
        tpot_s=tpot,
        lookup_acceptance=lookup_acceptance,
        reported_acceptance_rate=h.reported_acceptance_rate,
        reported_mean_acceptance_length=h.reported_mean_acceptance_length,
        probe=decision.probe,
        extra=_extra(result.retried, lookup_drafts_per_step),
    )


def _extra(retried: bool, lookup_drafts_per_step: float | None) -> dict[str, float]:
    extra: dict[str, float] = {}
    if retried:
        extra["retried"] = 1.0
    if lookup_drafts_per_step is not None:
        extra[LOOKUP_DRAFTS_KEY] = lookup_drafts_per_step
    return extra


def wants_lookup(result: ProxyResult) -> bool:
    """The answer completed and its text was collected (see ``ProxyCall.collect_text``)."""
    return bool(result.ok and result.harvest.text_chars)


def observe(
    model: ModelRuntime,
    features: RequestFeatures,
    decision: Decision,
    result: ProxyResult,
    *,
    started: float,
    lookup: tuple[float, float] | None = None,
) -> None:
    """Build the outcome and call ``policy.observe``; logs, never raises.

    ``lookup`` is :func:`realised_lookup_rates`' (acceptance per step ÷ k, draft tokens per step).
    """
    try:
        outcome = build_outcome(
            features,
            decision,
            result,
            started=started,
            lookup_acceptance=None if lookup is None else lookup[0],
            lookup_drafts_per_step=None if lookup is None else lookup[1],
        )
        if outcome is not None:
            model.policy.observe(outcome, time.monotonic())
    except Exception:
        log.exception("learning from a response failed (request unaffected)")


async def learn_with_lookup(
    model: ModelRuntime,
    features: RequestFeatures,
    decision: Decision,
    result: ProxyResult,
    prompt_text: str,
    *,
    started: float,
    k: int,
    n_min: int = 5,
    n_max: int = 5,
) -> None:
    """Replay the answer against the prompt as the engine's n-gram proposer would (in a
    thread when large), then observe."""
    lookup: tuple[float, float] | None = None
    try:
        completion = result.harvest.completion_text
        kw = {"k": k, "n_min": n_min, "n_max": n_max}
        if len(prompt_text) + len(completion) <= INLINE_LOOKUP_CHARS:
            lookup = realised_lookup_rates(prompt_text, completion, **kw)
        else:
            lookup = await asyncio.to_thread(realised_lookup_rates, prompt_text, completion, **kw)
    except Exception:
        log.exception("realised lookup failed (request unaffected)")
    observe(model, features, decision, result, started=started, lookup=lookup)
