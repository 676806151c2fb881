"""How many pairs speculate: a search over the fleet's regimes, from the traffic.

Every ``replan_s`` the planner prices the recent traffic (arrival rate, each request's
tokens per spec step ``E`` and verified tokens ``q``, the mean answer length) on ``N``
pairs for each number ``s`` of speculating pairs and each split of the traffic in which
the requests that gain most from speculation (highest ``E``) go to the ``s`` speculating
pairs and the rest to the ``N − s`` plain ones. A pool's batch per pair is where Little's
law and the step time agree (``B = λ · n · T(B) · ī``, solved by iteration; a pool whose
batch passes the engines' cap is saturated and priced out). The plan is the ``s`` with
the lowest mean time per token over its best split; the current ``s`` is kept unless
another is better by ``hysteresis`` (the traffic's sampling noise would otherwise flip
pairs back and forth).

The split only chooses ``s``: requests are then placed one by one at their lowest
marginal cost (:mod:`.prices`), which sorts them the same way and balances the load.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

StepTime = Callable[[bool, int], float]  # (spec, batch) -> ms per step
_ITERATIONS = 24
_SATURATED = 1e9


@dataclass(frozen=True, slots=True)
class Plan:
    speculating: int  # pairs that speculate
    cost_ms: float  # predicted mean time per token
    spec_share: float  # share of the requests the split sends to speculating pairs


class Planner:
    """The number of speculating pairs for the recent traffic (module doc)."""

    def __init__(
        self, *, window_s: float = 10.0, max_requests: int = 512, cuts: int = 16, hysteresis: float = 0.02
    ) -> None:
        self.window_s = window_s
        self.cuts = cuts
        self.hysteresis = hysteresis
        self.recent: deque[tuple[float, float, float]] = deque(maxlen=max_requests)  # (t, E, q)
        self.answer_tokens = 200.0  # mean answer length (EWMA over answers)

    def note(self, now: float, tokens_per_step: float, verified: float) -> None:
        self.recent.append((now, max(1.0, tokens_per_step), max(1.0, verified)))

    def answered(self, tokens: int) -> None:
        if tokens > 0:
            self.answer_tokens += 0.02 * (tokens - self.answer_tokens)

    def rate(self, now: float) -> float:
        """Arrivals per second over the window."""
        while self.recent and self.recent[0][0] < now - self.window_s:
            self.recent.popleft()
        if len(self.recent) < 2:
            return 0.0
        span = max(now - self.recent[0][0], 1.0)
        return len(self.recent) / span

    def plan(self, now: float, pairs: int, current: int, step: StepTime, cap: int) -> Plan | None:
        """The plan for ``pairs`` pairs (None: too little traffic seen to plan)."""
        lam = self.rate(now)
        if pairs < 1 or len(self.recent) < 8 or lam <= 0:
            return None
        es = sorted(((e, q) for _, e, q in self.recent), reverse=True)
        m = len(es)
        inv_prefix, q_prefix = [0.0], [0.0]
        for e, q in es:
            inv_prefix.append(inv_prefix[-1] + 1.0 / e)
            q_prefix.append(q_prefix[-1] + q)
        n = self.answer_tokens

        def pool(share: float, inv_e: float, k: int, spec: bool) -> float:
            """Mean time per token of a pool of ``k`` pairs taking ``share`` of the arrivals."""
            per_pair = lam * share / k
            b = 1.0
            for _ in range(_ITERATIONS):
                nb = per_pair * n * step(spec, int(b + 1.0)) * inv_e / 1000.0
                if nb > cap:
                    return _SATURATED * nb / cap
                if abs(nb - b) < 0.25:
                    b = nb
                    break
                b = nb
            return step(spec, int(b + 1.0)) * inv_e

        def cost(s: int) -> tuple[float, float]:
            if s == 0:
                return pool(1.0, 1.0, pairs, False), 0.0
            if s == pairs:
                return pool(1.0, inv_prefix[m] / m, pairs, True), 1.0
            best = (math.inf, 0.0)
            for j in range(1, self.cuts):
                c = max(1, min(m - 1, round(j * m / self.cuts)))
                share = c / m
                spec = pool(share, inv_prefix[c] / c, s, True)
                base = pool(1.0 - share, 1.0, pairs - s, False)
                total = share * spec + (1.0 - share) * base
                if total < best[0]:
                    best = (total, share)
            return best

        costs = {s: cost(s) for s in _candidates(pairs, current)}
        s_best = min(costs, key=lambda s: costs[s][0])
        keep = min(max(current, 0), pairs)
        if keep in costs and costs[s_best][0] >= costs[keep][0] * (1.0 - self.hysteresis):
            s_best = keep
        return Plan(s_best, costs[s_best][0], costs[s_best][1])


def _candidates(pairs: int, current: int) -> list[int]:
    """Every count on a small fleet; on a large one a coarse grid, refined around the
    current count (a plan moves by a few pairs at a time between replans)."""
    if pairs <= 16:
        return list(range(pairs + 1))
    grid = set(range(0, pairs + 1, max(1, pairs // 8))) | {pairs}
    c = min(max(current, 0), pairs)
    grid |= {x for x in range(c - 2, c + 3) if 0 <= x <= pairs}
    return sorted(grid)
