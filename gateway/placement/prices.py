"""What a request costs on a pair, counting what it does to the requests already there.

A pair runs one regime at a time (:mod:`gateway.routing.adaptive.costmodel`): every
request on it advances once per step of its engine, ``T(B)`` at a batch of ``B``. A
request that joins a pair holding ``B`` requests costs

- itself: ``T(B + 1) / E`` per token on a speculating pair (``E``: its tokens per step,
  corrected by the pair's live acceptance), ``T(B + 1)`` on a plain one;
- the others: each of them now steps at ``T(B + 1)`` instead of ``T(B)``, i.e.
  ``B · ī · (T(B + 1) − T(B))`` more per token (``ī``: the mean 1/E of the pair's traffic;
  1 on a plain pair).

The sum is the request's marginal cost: the fleet's summed time per token grows by that
much. Step times are the pair's own (its estimator's profile at the traffic's context,
times its measured step scales), memoised per integer batch until the next refresh, so a
decision over 64 pairs is a few table reads per pair.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.routing.adaptive.costmodel import regime_costs
from gateway.routing.adaptive.estimate import Estimator


@dataclass(slots=True)
class PairPrices:
    """One pair's step times by integer batch, as its estimator prices them now."""

    est: Estimator
    cap: int = 256
    inv_e: float = 1.0  # mean 1/E of the pair's recent traffic (live-corrected)
    ratio: float = 1.0  # the spec engine's live acceptance ratio
    _spec: dict[int, float] = field(default_factory=dict)
    _base: dict[int, float] = field(default_factory=dict)

    def refresh(self) -> None:
        """Forget the memoised step times: the estimator's corrections may have moved."""
        self._spec.clear()
        self._base.clear()
        self.inv_e = min(1.0, max(1e-3, self.est.inv_e_mix()))
        self.ratio = self.est.live.ratio

    def step_ms(self, spec: bool, batch: int) -> float:
        """One step of the regime's engine at ``batch`` (at least 1, at most the cap)."""
        b = min(max(1, batch), self.cap)
        memo = self._spec if spec else self._base
        t = memo.get(b)
        if t is None:
            est = self.est
            c = regime_costs(
                est.steps,
                load=float(b),
                q_spec=est.q_mix(),
                inv_tokens_per_step=1.0,
                scale_spec=est.live.scale(True, float(b)),
                scale_base=est.live.scale(False, float(b)),
                method=est.method,
                k=est.k,
            )
            t = memo[b] = c.spec_ms if spec else c.base_ms
        if batch > self.cap:  # queued requests wait whole steps: price the queue linearly
            t = t * batch / self.cap
        return t

    def marginal(self, spec: bool, load: float, tokens_per_step: float) -> float:
        """The request's marginal cost (ms per token, summed over the pair's requests)."""
        b = int(load + 0.5)
        t1 = self.step_ms(spec, b + 1)
        t0 = self.step_ms(spec, b) if b > 0 else t1
        if spec:
            e = 1.0 + (tokens_per_step - 1.0) * self.ratio
            return t1 / max(e, 1.0) + b * self.inv_e * (t1 - t0)
        return t1 + b * (t1 - t0)
