"""Per-request marginal cost on a shared device, where the regime leaves room for it.

The adaptive policy keeps one regime per pair (everything on spec, or everything on
plain: :mod:`gateway.routing.costmodel`), because splitting sustained traffic makes every
request pay both engines' steps. At low load that leaves gains on the table: a request
arriving at an idle pair pays nobody but itself, and one arriving while only the
*other* engine is busy would serialise the device if it went to the regime's engine.

Model (both engines on one timeline; a cycle is one step of each busy engine, and a
term is 0 while that engine's batch is empty)::

    C0 = T_s(Bs, q) + T_b(Bb, 1)
    spec: C1 = T_s(Bs + 1, q) + T_b(Bb, 1)   own = C1 / E_r   others = (C1 - C0) * W
    base: C2 = T_s(Bs, q) + T_b(Bb + 1, 1)   own = C2         others = (C2 - C0) * W

with ``W = Σ_spec 1/E_i + Bb`` the summed "cycles per token" of the requests already on
the device: the cost of an option is the sum of the time-per-token increases it causes,
its own included (the quantity mean TPOT adds up).

Joining the busy engine against the regime is allowed only while the busy engine's
population plus this request would still be served better where it is than moved to the
regime's engine (:func:`population_speedup`); otherwise, under sustained load, "join
the busy engine" would keep the pair in a regime the model already left.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from gateway.routing.config import RoutingConfig
from gateway.routing.overlap import KINDS
from gateway.routing.steptime import StepModel
from gateway.routing.types import EngineView, RequestFeatures, Route

POPULATION_MAX = 512  # 1/E of the latest requests sent to an engine (its in-flight population)
_DEFAULT_TOKENS = 256.0  # completion tokens expected before any were observed

StepFn = Callable[[float], float]  # batch -> ms per step (0 for an empty batch)


@dataclass(frozen=True, slots=True)
class MarginalCosts:
    spec_ms: float  # own + others, sending the request to spec
    base_ms: float  # own + others, sending it to plain
    own_spec_ms: float
    own_base_ms: float

    @property
    def own_speedup(self) -> float:
        """The request's own predicted speed-up on spec (plain ÷ spec time per token)."""
        return self.own_base_ms / self.own_spec_ms if self.own_spec_ms > 0 else 1.0

    @property
    def prefers_spec(self) -> bool:
        return self.spec_ms < self.base_ms


def marginal_costs(
    t_spec: StepFn,
    t_base: StepFn,
    *,
    spec_load: float,
    base_load: float,
    tokens_per_step: float,
    others_weight: float,
) -> MarginalCosts:
    """Cost of each option for one request (see the module docstring)."""
    e = max(1.0, tokens_per_step)
    ts0, tb0 = t_spec(spec_load), t_base(base_load)
    c0 = ts0 + tb0
    c1 = t_spec(spec_load + 1.0) + tb0
    c2 = ts0 + t_base(base_load + 1.0)
    w = max(0.0, others_weight)
    own_s, own_b = c1 / e, c2
    return MarginalCosts(
        spec_ms=own_s + (c1 - c0) * w,
        base_ms=own_b + (c2 - c0) * w,
        own_spec_ms=own_s,
        own_base_ms=own_b,
    )


def population_speedup(t_spec_full: float, t_base_full: float, inv_sum: float, count: float) -> float:
    """Predicted speed-up of serving a population on spec rather than on plain.

    ``t_*_full`` are both engines' step times at the population's size; ``inv_sum`` the
    sum of the population's 1/E over ``count`` requests (harmonic mean: slow requests
    weigh most).
    """
    if count <= 0 or t_spec_full <= 0:
        return 1.0
    inv = min(1.0, max(1e-3, inv_sum / count))
    return t_base_full / (t_spec_full * inv)


def engine_load(e: EngineView) -> float:
    """An engine's load: the larger of the gateway's exact in-flight count and scraped."""
    scraped = (e.running or 0.0) + (e.waiting or 0.0)
    return max(float(e.inflight), scraped)


class PerRequestChoices:
    """The per-request choices of the adaptive policy (mixed into it; state lives there)."""

    cfg: RoutingConfig
    steps: StepModel
    method: str
    k: int
    scale_spec: float
    scale_base: float
    q_ratio: float
    _mix: deque[tuple[float, float, float]]
    _spec_inv: deque[float]
    _base_inv: deque[float]
    _tokens: dict[str, float]

    def _q_mix(self) -> float:
        raise NotImplementedError

    def _inv_e_mix(self) -> float:
        raise NotImplementedError

    def _t_spec(self, b: float, q: float) -> float:
        if b <= 0:
            return 0.0
        return self.scale_spec * (
            self.steps.step_ms(b, max(1.0, q)) + self.steps.spec_extra_ms(self.method, self.k, b)
        )

    def _t_base(self, b: float) -> float:
        return self.scale_base * self.steps.step_ms(b, 1.0) if b > 0 else 0.0

    def _per_request(
        self, spec: EngineView, base: EngineView, e: float, q: float, route: Route, tokens: float
    ) -> tuple[Route, str, float] | None:
        """Where the regime leaves room for a per-request choice (:mod:`gateway.routing.marginal`).

        An idle pair: the request pays for itself, and for the requests expected to arrive
        while it runs on the engine the regime does not use (they then share the device
        with it: each pays the other engine's step for the overlap). Only the engine the regime does not
        use is busy: joining it avoids running both steps per cycle, as long as its
        population plus this request is still better served there (else sustained load
        would hold the pair in a regime the model left). Returns the overriding
        (route, reason, own speed-up), or None to keep the regime's route.
        """
        ls, lb = engine_load(spec), engine_load(base)
        threshold = 1.0 + self.cfg.margin
        if ls <= 0 and lb <= 0:
            qr = 1.0 + (q - 1.0) * self.q_ratio
            t_s, t_b = self._t_spec(1.0, qr), self._t_base(1.0)
            own = t_b / (t_s / max(1.0, e))
            alt = Route.SPEC if own > threshold else Route.BASE
            if alt is route:
                return None
            # ms per token of this request: its own gain, and the expected harm of overlaps.
            # An arrival during its lifetime overlaps it for half its length on average;
            # while both run, each pays the other's step per cycle of its own.
            own_alt, own_reg = (t_s / max(1.0, e), t_b) if alt is Route.SPEC else (t_b, t_s / max(1.0, e))
            t_other = t_b if alt is Route.SPEC else self._t_spec(1.0, self._q_mix())
            arrivals = self._arrival_rate() * tokens * own_alt / 1000.0
            e_alt = max(1.0, e) if alt is Route.SPEC else 1.0
            harm = 0.5 * arrivals * (t_other / e_alt + own_alt)
            if own_reg - own_alt > harm:
                return alt, "idle_pair", own
            return None
        qs = self._q_mix()
        inv_r = 1.0 / max(1.0, e)
        if route is Route.BASE and ls > 0 and lb <= 0:
            inv_others = self._population_inv(self._spec_inv, ls)
            m = marginal_costs(
                lambda b: self._t_spec(b, qs),
                self._t_base,
                spec_load=ls,
                base_load=0.0,
                tokens_per_step=e,
                others_weight=inv_others,
            )
            stay = population_speedup(
                self._t_spec(ls + 1, qs), self._t_base(ls + 1), inv_others + inv_r, ls + 1
            )
            if m.prefers_spec and stay > threshold:
                return Route.SPEC, "joins_busy_engine", m.own_speedup
        elif route is Route.SPEC and lb > 0 and ls <= 0:
            m = marginal_costs(
                lambda b: self._t_spec(b, qs),
                self._t_base,
                spec_load=0.0,
                base_load=lb,
                tokens_per_step=e,
                others_weight=lb,
            )
            inv_base = self._population_inv(self._base_inv, lb)
            move = population_speedup(
                self._t_spec(lb + 1, qs), self._t_base(lb + 1), inv_base + inv_r, lb + 1
            )
            if not m.prefers_spec and move < threshold:
                return Route.BASE, "joins_busy_engine", m.own_speedup
        return None

    def _population_inv(self, sent: deque[float], load: float) -> float:
        """Σ 1/E of an engine's in-flight requests: the latest sent there, padded with the mix."""
        n = math.ceil(load)
        pop = list(itertools.islice(reversed(sent), n))
        return sum(pop) + (n - len(pop)) * self._inv_e_mix()

    def _arrival_rate(self) -> float:
        """Requests per second of the recent eligible traffic (0 with too little history)."""
        mix = self._mix
        span = mix[-1][0] - mix[0][0] if len(mix) > 1 else 0.0
        return (len(mix) - 1) / span if span > 0 else 0.0

    def _expected_tokens(self, f: RequestFeatures) -> float:
        kind = f.kind if f.kind in KINDS else "chat"
        n = self._tokens.get(kind, self._tokens.get("", _DEFAULT_TOKENS))
        return min(n, float(f.max_tokens)) if f.max_tokens else n
