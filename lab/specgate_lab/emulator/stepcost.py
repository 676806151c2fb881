"""What one engine step costs: the batch :meth:`Engine.plan_step` formed, priced.

The scheduler (:mod:`specgate_lab.emulator.engine`) decides which requests a step serves and
how many tokens each drafts; :func:`price_step` turns that batch into a
:class:`~specgate_lab.emulator.engine_types.StepPlan` whose duration comes from the engine's
:class:`~gateway.physics.StepTimeProfile`, plus the drafter's cost on speculative engines.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.physics import StepTimeProfile
from specgate_lab.emulator.drafting import draft_cost_ms
from specgate_lab.emulator.engine_types import StepEntry, StepPlan
from specgate_lab.emulator.spec import SpecConfig, k0_overhead

SLOPE_REF_BATCH = 8.0  # the batch where a sloped scale equals its value


def price_step(
    entries: Sequence[StepEntry],
    *,
    profile: StepTimeProfile,
    spec: SpecConfig | None,
    k_now: int,
    n_dec: int,
    dec_tokens: int,
    ctx_sum: int,
    drafted_k: int,
    overhead_ms: float,
    spec_cost_scale: float = 1.0,
    device_scale: float = 1.0,
    spec_cost_slope: float = 0.0,
    device_scale_slope: float = 0.0,
) -> StepPlan:
    """The plan of a step serving ``entries`` (not empty): ``n_dec`` decoding requests
    verifying ``dec_tokens`` tokens in all (drafts included) over ``ctx_sum`` tokens of
    context, the longest draft ``drafted_k``, the speculative length ``k_now`` this step
    (Dynamic SD), and ``overhead_ms`` of extra host time.

    ``spec_cost_scale`` scales what speculation adds to a step (verifying the drafts beyond
    one token per sequence, and drafting): the part of the physics a profile measured on
    one drafter and one vLLM version predicts least well. 1 = the profile; the simulator
    sets it to run engines whose truth differs from the router's prior. ``device_scale``
    scales the whole step (another GPU than the profile's), drafting included. Each is
    multiplied by (batch ÷ :data:`SLOPE_REF_BATCH`) ** its slope (0: flat)."""
    prefill_tokens = sum(e.prefill for e in entries)
    n_prefill = sum(1 for e in entries if e.prefill)
    batch = n_dec + n_prefill
    q = (dec_tokens + n_prefill) / batch
    ctx = ctx_sum / n_dec if n_dec else float(max(1, prefill_tokens // max(1, n_prefill)))
    prof = profile
    rel = max(1, batch) / SLOPE_REF_BATCH
    spec_cost_scale *= rel**spec_cost_slope
    device_scale *= rel**device_scale_slope
    step_ms = prof.step_ms(batch, q, ctx) + prof.prefill_ms(prefill_tokens)
    draft_ms = 0.0
    if spec is not None and k_now == 0:
        # A Dynamic SD step at K=0 proposes nothing; what the speculative machinery still
        # costs is the whole-step overhead vLLM issue 49548 measured against plain decoding.
        step_ms *= 1.0 + k0_overhead(batch)
    elif spec is not None and n_dec:
        draft_ms = draft_cost_ms(prof, spec, drafted_k, n_dec, ctx) * spec_cost_scale
        if spec_cost_scale != 1.0 and dec_tokens > n_dec:
            plain_ms = prof.step_ms(batch, 1.0, ctx) + prof.prefill_ms(prefill_tokens)
            step_ms = plain_ms + spec_cost_scale * (step_ms - plain_ms)
    total_ms = (step_ms + draft_ms) * device_scale + overhead_ms
    return StepPlan(
        batch=batch,
        q=q,
        ctx=ctx,
        prefill_tokens=prefill_tokens,
        num_tokens=dec_tokens + prefill_tokens,
        draft_ms=draft_ms,
        duration_s=total_ms / 1e3,
        entries=tuple(entries),
    )
