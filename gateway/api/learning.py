"""After a response: the gateway's learning step.

What the relay saw (:class:`~gateway.proxy.result.ProxyResult`) becomes the pipeline's
:class:`~gateway.pipeline.outcome.Answer`, the shared pipeline's
:func:`~gateway.pipeline.outcome.build_outcome` turns it into an :class:`Outcome`, and the
model's policy observes it. The proxy only relays; deciding what an answer teaches the
policy happens here, after it. Never fails a request."""

from __future__ import annotations

import asyncio
import logging
import time

from gateway.advisor.replay import Replay
from gateway.advisor.report import Advice
from gateway.engines.runtime import ModelRuntime
from gateway.pipeline.outcome import Answer, LookupSettings, build_outcome, replay_lookup_stats
from gateway.proxy.result import ProxyResult
from gateway.routing.acceptance import temp_bucket
from gateway.routing.overlap import lookup_rates
from gateway.routing.types import Decision, RequestFeatures

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


def answer_of(result: ProxyResult, started: float) -> Answer | None:
    """What the relay saw of the answer (None when no engine was reached)."""
    if result.engine is None or result.route is None:
        return None
    h = result.harvest
    return Answer(
        route=result.route,
        engine=result.engine,
        ok=result.ok,
        started=started,
        first_token_at=result.first_token_at,
        last_token_at=result.last_token_at,
        completion_tokens=h.completion_tokens if h.completion_tokens is not None else h.content_events,
        prompt_tokens=h.prompt_tokens,
        reported_acceptance_rate=h.reported_acceptance_rate,
        reported_mean_acceptance_length=h.reported_mean_acceptance_length,
        retried=result.retried,
    )


def lookup_settings(model: ModelRuntime, engine: str | None) -> LookupSettings:
    """The lookup settings of the pair whose engine served the answer (the first pair's when
    the engine is unknown)."""
    pair = next((p for p in model.pairs if engine in (p.spec.name, p.base.name)), model.pairs[0])
    cfg = pair.spec.config
    return LookupSettings.of(cfg.k, cfg.prompt_lookup_min, cfg.prompt_lookup_max)


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
        answer = answer_of(result, started)
        if answer is not None:
            # The prediction was for the decision's engine: an answer that moved or failed
            # over measured another (or both), and teaches the latency correction nothing.
            own = result.engine == decision.engine and not result.moved
            outcome = build_outcome(
                features,
                answer,
                probe=decision.probe,
                lookup=lookup,
                predicted_tpot_s=decision.predicted_tpot_s if own else None,
            )
            model.policy.observe(outcome, time.monotonic())
            for hook in model.on_outcome:
                hook(outcome)
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
    advice: Advice | None = None,
) -> None:
    """Replay the answer against the prompt as the serving pair's n-gram proposer would (in
    a thread when large), add it to the model's ``advice`` (:mod:`gateway.advisor`), then
    observe."""
    lookup: tuple[float, float] | None = None
    try:
        completion = result.harvest.completion_text
        settings = lookup_settings(model, result.engine)
        if len(prompt_text) + len(completion) <= INLINE_LOOKUP_CHARS:
            got = replay_lookup_stats(prompt_text, completion, settings)
        else:
            got = await asyncio.to_thread(replay_lookup_stats, prompt_text, completion, settings)
        if got is not None:
            stats, prompt_tokens = got
            lookup = lookup_rates(stats, settings.k)
            if advice is not None and settings == advice.settings:
                t = features.temperature
                advice.add(Replay(features.kind, t, temp_bucket(t), prompt_tokens, stats))
    except Exception:
        log.exception("realised lookup failed (request unaffected)")
    observe(model, features, decision, result, started=started, lookup=lookup)
