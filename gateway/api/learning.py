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
from typing import Protocol

from gateway.advisor.replay import MAX_ANSWER_CHARS, MAX_PROMPT_CHARS, Replay
from gateway.advisor.report import Advice
from gateway.config import ModelConfig
from gateway.engines.runtime import ModelRuntime
from gateway.physics.methods import PROMPT_LOOKUP_METHODS
from gateway.pipeline.outcome import Answer, LookupSettings, build_outcome, replay_lookup_stats
from gateway.proxy.sse import Harvest
from gateway.routing.acceptance import temp_bucket
from gateway.routing.overlap import lookup_rates
from gateway.routing.types import Decision, RequestFeatures, Route
from gateway.text.lookup import LookupStats
from gateway.text.suffix import realised_suffix
from gateway.text.tokens import tokenize

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


class Relayed(Protocol):
    """What learning reads of an answer that went through: the proxy's
    :class:`~gateway.proxy.result.ProxyResult`, or what the Endpoint Picker saw of it."""

    @property
    def engine(self) -> str | None: ...
    @property
    def route(self) -> Route | None: ...
    @property
    def ok(self) -> bool: ...
    @property
    def retried(self) -> bool: ...
    @property
    def moved(self) -> bool: ...
    @property
    def harvest(self) -> Harvest: ...
    @property
    def first_token_at(self) -> float | None: ...
    @property
    def last_token_at(self) -> float | None: ...


def answer_of(result: Relayed, started: float) -> Answer | None:
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
    """The lookup settings of the pair whose engine served the answer (the model's when the
    engine is unknown: its pair left meanwhile); the advisor's for a plain engine alone."""
    pair = model.pair_of(engine)
    if pair is None or pair.spec is None:
        return advice_settings(model.config)
    cfg = pair.spec.config
    return LookupSettings.of(cfg.k, cfg.prompt_lookup_min, cfg.prompt_lookup_max)


def advice_settings(config: ModelConfig) -> LookupSettings:
    """The n-gram proposer the advisor replays answers through: the model's n-gram engine's
    where it has one, else the model's ``advice`` settings."""
    spec = next((p.spec for p in config.pairs if p.spec is not None), None)
    found = None if config.discovery is None else config.discovery.spec  # pairs found live
    if spec is not None and spec.method in PROMPT_LOOKUP_METHODS:
        return LookupSettings.of(spec.k, spec.prompt_lookup_min, spec.prompt_lookup_max)
    if spec is None and found is not None and found.method in PROMPT_LOOKUP_METHODS:
        return LookupSettings.of(found.k, found.prompt_lookup_min, found.prompt_lookup_max)
    a = config.advice
    return LookupSettings(a.k, a.prompt_lookup_min, a.prompt_lookup_max)


async def _advise(
    advice: Advice,
    features: RequestFeatures,
    result: Relayed,
    prompt_text: str,
    ngram: tuple[LookupStats, int] | None,
    *,
    in_flight: float,
) -> None:
    """Add the answer to ``advice``: its n-gram replay (``ngram`` when the serving pair's
    already is the advisor's), its suffix replay (in a thread, one at a time: the replays
    share the cache of earlier answers) and, for a plain answer, its time per token at
    ``in_flight`` (the model's requests in flight as it ended)."""
    completion = result.harvest.completion_text
    if ngram is None:
        ngram = await _replay(prompt_text, completion, advice.settings)
    if ngram is None:
        return
    stats, prompt_tokens = ngram
    suffix = None
    if advice.suffix is not None and advice.answers is not None:
        suffix = await asyncio.to_thread(_suffix_replay, advice, prompt_text, completion)
    t = features.temperature
    advice.add(Replay(features.kind, t, temp_bucket(t), prompt_tokens, stats, suffix))
    h = result.harvest
    tokens = h.completion_tokens if h.completion_tokens is not None else h.content_events
    first, last = result.first_token_at, result.last_token_at
    if result.route is Route.BASE and not result.moved and first and last and tokens > 1:
        advice.observe_plain((last - first) / (tokens - 1), in_flight)


def _suffix_replay(advice: Advice, prompt_text: str, completion: str) -> LookupStats:
    prompt = tokenize(prompt_text[-MAX_PROMPT_CHARS:])
    answer = tokenize(completion[:MAX_ANSWER_CHARS])
    with advice.lock:
        return realised_suffix(prompt, answer, advice.suffix, advice.answers)


async def _replay(
    prompt_text: str, completion: str, settings: LookupSettings
) -> tuple[LookupStats, int] | None:
    if len(prompt_text) + len(completion) <= INLINE_LOOKUP_CHARS:
        return replay_lookup_stats(prompt_text, completion, settings)
    return await asyncio.to_thread(replay_lookup_stats, prompt_text, completion, settings)


def wants_lookup(result: Relayed) -> bool:
    """The answer completed and its text was collected (see ``ProxyCall.collect_text``)."""
    return bool(result.ok and result.harvest.text_chars)


def observe(
    model: ModelRuntime,
    features: RequestFeatures,
    decision: Decision,
    result: Relayed,
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
    result: Relayed,
    prompt_text: str,
    *,
    started: float,
    advice: Advice | None = None,
) -> None:
    """Replay the answer against the prompt as the serving pair's n-gram proposer would (in
    a thread when large) and observe; then add it to the model's ``advice``
    (:mod:`gateway.advisor`), which replays it as the advisor's proposers would where that
    differs (after the policy learned: the advice must not delay routing's learning)."""
    lookup: tuple[float, float] | None = None
    got: tuple[LookupStats, int] | None = None
    settings: LookupSettings | None = None
    try:
        settings = lookup_settings(model, result.engine)
        got = await _replay(prompt_text, result.harvest.completion_text, settings)
        if got is not None:
            lookup = lookup_rates(got[0], settings.k)
    except Exception:
        log.exception("realised lookup failed (request unaffected)")
    observe(model, features, decision, result, started=started, lookup=lookup)
    if advice is None:
        return
    try:
        ngram = got if advice.settings == settings else None
        await _advise(advice, features, result, prompt_text, ngram, in_flight=float(max(1, model.inflight)))
    except Exception:
        log.exception("advice from an answer failed (request unaffected)")
