"""The profile is read at the context the traffic holds, the same for both engines: a
profile error that is plain decoding physics must not be credited to whichever regime
happened to run (and be measured) first."""

from __future__ import annotations

import pytest

from gateway import physics
from gateway.routing.adaptive import AdaptivePolicy
from gateway.routing.adaptive.context import ContextTracker
from gateway.routing.config import RoutingConfig
from gateway.routing.steptime import TableStepModel
from gateway.routing.types import Outcome, Route


def test_the_context_is_the_answer_weighted_mean_a_batch_holds() -> None:
    c = ContextTracker(prior=1024)
    assert c.mean() == 1024.0 and c.bucket() == 1024  # nothing answered yet: the prior
    c.observe(300, 200)  # 200 steps at a mean of 300 + 100 tokens
    assert c.mean() == pytest.approx(400.0)
    for _ in range(200):  # a long answer runs more steps, so it weighs more
        c.observe(100, 100)
        c.observe(100, 900)
    # (100·150 + 900·550) / (100 + 900) = 510
    assert c.mean() == pytest.approx(510.0, rel=0.02)
    assert c.bucket() == 512  # quarter octaves


def test_unusable_answers_are_ignored_and_buckets_are_bounded() -> None:
    c = ContextTracker(prior=1024)
    c.observe(100, 0)
    c.observe(-1, 10)
    assert c.answers == 0
    c.observe(0, 2)
    assert c.bucket() == 64  # never below 64 tokens
    big = ContextTracker(prior=1 << 30)
    assert big.bucket() == 1 << 20


def _answer(prompt: int, tokens: int) -> Outcome:
    return Outcome(
        "m", Route.BASE, "base", "chat", 1.0, ok=True, prompt_tokens=prompt, completion_tokens=tokens
    )


def test_the_policy_reads_the_profile_at_the_measured_context() -> None:
    cfg = RoutingConfig(policy="adaptive")
    p = AdaptivePolicy(cfg)
    profile = physics.get_profile(cfg.profile)
    assert p.estimator.steps.step_ms(64, 1) == pytest.approx(profile.step_ms(64, 1, 1024))
    for i in range(100):  # short prompts, short answers: ~230 tokens held
        p.observe(_answer(150, 160), float(i))
    ctx = p.estimator.context.bucket()
    assert ctx < 300
    short = p.estimator.steps.step_ms(64, 1)
    assert short == pytest.approx(profile.step_ms(64, 1, ctx))
    assert short < profile.step_ms(64, 1, 1024)  # less KV to read per step
    assert p.snapshot()["context_tokens"] == round(p.estimator.context.mean())


def test_a_given_step_model_is_kept() -> None:
    table = TableStepModel()
    p = AdaptivePolicy(RoutingConfig(policy="adaptive"), steps=table)
    p.observe(_answer(150, 160), 0.0)
    assert p.estimator.steps is table
