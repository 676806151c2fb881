"""What a request costs on a pair, counting what it does to the requests already there.

A pair runs one regime at a time (:mod:`gateway.routing.adaptive.costmodel`): every
request on it advances once per step of its engine, ``T(B)`` at a batch of ``B``. What the
fleet is judged on is the mean over requests of their time per token. A request that joins
a pair holding ``B`` requests adds

- its own: ``T(B + 1) / E`` on a speculating pair (``E``: its tokens per step, corrected by
  the pair's live acceptance), ``T(B + 1)`` on a plain one;
- the others': each of them steps at ``T(B + 1)`` instead of ``T(B)`` while the newcomer
  runs, i.e. for its duration, ``n · T / E``; over an answer of their own, each loses
  ``(T(B + 1) − T(B)) / E_j`` per token for a share ``(n · T / E) / (n_j · T / E_j)`` of
  its life: summed over the ``B`` others (answers of about the same length), ``B · (T(B +
  1) − T(B)) / E``. A request that gains little from speculation stays long on a
  speculating pair and slows everybody there for longer.

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
    """One pair's step times by integer batch, as its estimator prices them now, and the
    marginal cost tables built from them (memoised until the estimator's prices move)."""

    est: Estimator
    cap: int = 256
    ratio: float = 1.0  # the spec engine's live acceptance ratio
    impact: float = 1.0  # weight of what the request does to the others (1: their full cost)
    # marginal cost by load (index: requests on the pair), per regime; spec's before ÷ E
    tables: tuple[list[float], list[float]] = field(default_factory=lambda: ([], []))
    _steps: tuple[dict[int, float], dict[int, float]] = field(default_factory=lambda: ({}, {}))
    _signature: tuple[object, ...] = ()

    def refresh(self) -> None:
        """Read the estimator's prices again; the tables are rebuilt only if they moved."""
        est = self.est
        self.ratio = est.live.ratio
        sig = (
            id(est.steps),
            round(est.q_mix(), 2),
            round(est.live.scale(True, 8.0), 3),
            round(est.live.scale(False, 8.0), 3),
            round(est.live.scale(True, 64.0), 3),
            round(est.live.scale(False, 64.0), 3),
        )
        if sig != self._signature:
            self._signature = sig
            for t in (*self.tables, *self._steps):
                t.clear()

    def step_ms(self, spec: bool, batch: int) -> float:
        """One step of the regime's engine at ``batch`` (at least 1, at most the cap)."""
        b = min(max(1, batch), self.cap)
        memo = self._steps[0 if spec else 1]
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

    def extend(self, spec: bool, load: int) -> float:
        """The regime's table up to ``load``; its entry there."""
        table = self.tables[0 if spec else 1]
        for b in range(len(table), load + 1):
            t1 = self.step_ms(spec, b + 1)
            t0 = self.step_ms(spec, b) if b > 0 else t1
            table.append(t1 + self.impact * b * (t1 - t0))
        return table[load]

    def marginal(self, spec: bool, load: float, tokens_per_step: float) -> float:
        """The request's marginal cost (ms per token, over the pair's requests)."""
        b = int(load + 0.5)
        table = self.tables[0 if spec else 1]
        cost = table[b] if b < len(table) else self.extend(spec, b)
        if spec:
            return cost / max(1.0, 1.0 + (tokens_per_step - 1.0) * self.ratio)
        return cost
