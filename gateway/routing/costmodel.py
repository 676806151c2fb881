"""The cost of serving one request on either engine of a pair that shares a device.

Both engines step on one device timeline (two processes on one GPU are time-sliced,
almost fully serialised): while both have work, one *cycle* is a step of each, and every
request advances once per cycle. In milliseconds:

- on spec:  own cycle = T_s(B_s + 1, k + 1) + T_b(B_b, 1) if the plain engine is busy,
  and the request emits E tokens per cycle;
- on base:  own cycle = T_b(B_b + 1, 1) + T_s(B_s, k + 1) if the spec engine is busy,
  and the request emits 1 token per cycle.

Joining an engine also delays the others, in two ways: the requests already on that
engine step in a batch one larger (the marginal batch cost, ``T(B + 1) − T(B)``), and
the requests on the *other* engine wait for that engine's whole step in every cycle.
The second is a fixed cost of keeping an engine busy; it is shared equally among the
requests that keep it busy (``T(B + 1) / (B + 1)`` each; all of it when the request
would wake an idle engine). Counting only the marginal part would make "both engines
busy" a sticky state at high load, where consolidating everything on the plain engine
(one step per cycle instead of two) is what actually wins. Per output token of this
request, each engine is scored ``(own cycle + w · delay imposed on others) / tokens per
cycle``, in request-milliseconds.
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

    e = max(1.0, tokens_per_step)

    spec_cycle = ts(b_spec + 1) + tb(b_base)
    spec_imposed = b_spec * (ts(b_spec + 1) - ts(b_spec)) + b_base * ts(b_spec + 1) / (b_spec + 1)
    spec_total = spec_cycle + marginal_weight * spec_imposed

    base_cycle = tb(b_base + 1) + ts(b_spec)
    base_imposed = b_base * (tb(b_base + 1) - tb(b_base)) + b_spec * tb(b_base + 1) / (b_base + 1)
    base_total = base_cycle + marginal_weight * base_imposed

    spec_ms = spec_total / e
    break_even = spec_total * (1.0 + margin) / base_total if base_total > 0 else float("inf")
    return Costs(
        spec_ms=spec_ms,
        base_ms=base_total,
        spec_own_ms=spec_cycle / e,
        base_own_ms=base_cycle,
        break_even_tokens_per_step=break_even,
    )
