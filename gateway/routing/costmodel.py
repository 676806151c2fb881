"""The cost of serving one request on either engine of a pair that shares a device.

Both engines step on one device timeline (two processes on one GPU are time-sliced,
almost fully serialised): while both have work, one *cycle* is a step of each, and every
request advances once per cycle. In milliseconds:

- on spec:  own cycle = T_s(B_s + 1, k + 1) + T_b(B_b, 1) if the plain engine is busy,
  and the request emits E tokens per cycle;
- on base:  own cycle = T_b(B_b + 1, 1) + T_s(B_s, k + 1) if the spec engine is busy,
  and the request emits 1 token per cycle.

Joining an engine lengthens every other request's cycle by the step time it adds
(the whole step, when it wakes an idle engine; the marginal batch cost otherwise). Over
the request's life that costs the others ``others × added`` request-milliseconds per
cycle. The decision compares, per output token of this request,
``(own cycle + w · others · added) / tokens per cycle`` on each engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.routing.steptime import StepModel


@dataclass(frozen=True, slots=True)
class Costs:
    spec_ms: float  # own + weighted marginal cost per output token, on spec
    base_ms: float  # same, on base
    spec_own_ms: float  # own time per output token on spec (predicted TPOT)
    base_own_ms: float
    break_even_tokens_per_step: float  # E at which spec costs (1 + margin) × less than base

    @property
    def speedup(self) -> float:
        return self.base_ms / self.spec_ms if self.spec_ms > 0 else 1.0


def pair_costs(
    steps: StepModel,
    *,
    k: int,
    b_spec: float,
    b_base: float,
    tokens_per_step: float,
    scale_spec: float = 1.0,
    scale_base: float = 1.0,
    marginal_weight: float = 1.0,
    margin: float = 0.0,
) -> Costs:
    q = k + 1

    def ts(b: float) -> float:
        return scale_spec * steps.step_ms(b, q) if b > 0 else 0.0

    def tb(b: float) -> float:
        return scale_base * steps.step_ms(b, 1) if b > 0 else 0.0

    others = b_spec + b_base
    e = max(1.0, tokens_per_step)

    spec_cycle = ts(b_spec + 1) + tb(b_base)
    spec_added = ts(b_spec + 1) - ts(b_spec)
    spec_total = spec_cycle + marginal_weight * others * spec_added

    base_cycle = tb(b_base + 1) + ts(b_spec)
    base_added = tb(b_base + 1) - tb(b_base)
    base_total = base_cycle + marginal_weight * others * base_added

    spec_ms = spec_total / e
    break_even = spec_total * (1.0 + margin) / base_total if base_total > 0 else float("inf")
    return Costs(
        spec_ms=spec_ms,
        base_ms=base_total,
        spec_own_ms=spec_cycle / e,
        base_own_ms=base_cycle,
        break_even_tokens_per_step=break_even,
    )
