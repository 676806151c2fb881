"""After a response: build the :class:`Outcome` and feed it to the policy. Never fails a request."""

from __future__ import annotations

import asyncio
import logging
import time

from gateway.engines.runtime import ModelRuntime
from gateway.proxy.forward import ProxyResult
from gateway.routing.overlap import realised_lookup_acceptance
from gateway.routing.types import Decision, Outcome, RequestFeatures

log = logging.getLogger(__name__)

INLINE_LOOKUP_CHARS = 8 * 1024  # prompt+completion below this: compute on the loop


def build_outcome(
    features: RequestFeatures,
    decision: Decision,
    result: ProxyResult,
    *,
    started: float,
    lookup_acceptance: float | None,
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
        extra={"retried": 1.0} if result.retried else {},
    )


async def learn(
    model: ModelRuntime,
    features: RequestFeatures,
    decision: Decision,
    result: ProxyResult,
    prompt_text: str,
    *,
    started: float,
    k: int,
) -> None:
    """Compute the realised lookup acceptance and call ``policy.observe``; logs, never raises."""
    try:
        lookup: float | None = None
        completion = result.harvest.completion_text
        if result.ok and completion and prompt_text:
            if len(prompt_text) + len(completion) <= INLINE_LOOKUP_CHARS:
                lookup = realised_lookup_acceptance(prompt_text, completion, k=k)
            else:
                lookup = await asyncio.to_thread(realised_lookup_acceptance, prompt_text, completion, k=k)
        outcome = build_outcome(features, decision, result, started=started, lookup_acceptance=lookup)
        if outcome is not None:
            model.policy.observe(outcome, time.monotonic())
    except Exception:
        log.exception("learning from a response failed (request unaffected)")
