"""Predicted time per output token of a pair of engines that share one device.

Two engines on one GPU are time-sliced, almost fully serialised: while both have work,
every request advances once per *cycle* = one step of each engine. Splitting traffic
across the two therefore makes everybody pay both steps, and wastes batching (two small
batches each re-read all weights). On this physics the useful choices for a pair are
*regimes* — everything on the speculative engine, or everything on the plain one — and
the question per moment is which regime serves the current traffic faster:

- all on plain:  every request advances one token per T_b(B, 1);
- all on spec:   a request with E tokens per step advances E tokens per T_s(B, q̄),
  where q̄ is the mean tokens verified per sequence (1 + drafts; n-gram steps without
  a match verify one token only).

Mean time per output token: plain T_b(B, 1); spec T_s(B, q̄) · mean(1/E) over the traffic
(a harmonic mean: slow requests weigh most). ``B`` is the pair's whole load plus this
request. The predicted speed-up of the spec regime is the ratio; the break-even is the
harmonic-mean E at which it equals ``1 + margin``.

Both regimes also prefill the prompts of the requests they admit, inside their steps. Per
output token that costs the same in either: B requests whose prompts are P tokens per L
answer tokens need c·B·P/L ms of prefill per token each of them emits (c: the per-token
prefill cost). Spec steps carry E times more of it than plain steps, and emit E times
more tokens. This shared term (``shared_ms``) brings the ratio toward 1 where prompts are
long and the batch is large: without it, a saturated pair of long prompts would be priced
as if decoding were all its steps did.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.routing.steptime import StepModel

_MIN_INVERSE_E = 1e-3  # at most 1,000 tokens per step: guards a prior gone wild


@dataclass(frozen=True, slots=True)
class RegimeCosts:
    base_ms: float  # mean time per output token, everything on the plain engine
    spec_ms: float  # same, everything on the speculative engine
    break_even_tokens_per_step: float  # harmonic-mean E where spec = base / (1 + margin)
    shared_ms: float = 0.0  # the part of both that is prefill (per output token)

    @property
    def speedup(self) -> float:
        return self.base_ms / self.spec_ms if self.spec_ms > 0 else 1.0


def regime_costs(
    steps: StepModel,
    *,
    load: float,
    q_spec: float,
    inv_tokens_per_step: float,
    scale_spec: float = 1.0,
    scale_base: float = 1.0,
    margin: float = 0.0,
    method: str = "ngram",
    k: int = 5,
    prefill_per_token: float = 0.0,
) -> RegimeCosts:
    """``prefill_per_token``: prompt tokens prefilled per answer token of the traffic (P/L)."""
    b = max(1.0, load)
    t_base = scale_base * steps.step_ms(b, 1)
    t_spec = scale_spec * (steps.step_ms(b, max(1.0, q_spec)) + steps.spec_extra_ms(method, k, b))
    inv_e = min(1.0, max(_MIN_INVERSE_E, inv_tokens_per_step))
    shared = steps.prefill_ms_per_token() * b * max(0.0, prefill_per_token)
    # base + X = (1 + m)(t_spec / E + X)  =>  E = (1 + m) t_spec / (base − m X)
    room = t_base - margin * shared
    be = (1.0 + margin) * t_spec / room if room > 0 else float("inf")
    return RegimeCosts(
        base_ms=t_base + shared,
        spec_ms=t_spec * inv_e + shared,
        break_even_tokens_per_step=be,
        shared_ms=shared,
    )
