"""Hard rules applied before any policy: refused parameters, dead engines, pinned and forced routes.

Their order is their precedence: parameters a speculative engine refuses, then engines
that are down, then the operator's pin (``POST /admin/route``), then a client's
``x-specgate-route`` header (honoured only where the configuration allows it).

Every policy goes through :func:`apply_hard_rules` first; a policy's own logic only runs
when the rules leave the choice open.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.routing.types import (
    Decision,
    EngineView,
    ModelView,
    PairView,
    Reason,
    RequestFeatures,
    Route,
    RouteOverride,
)


class NoEngineAvailable(Exception):
    """Every engine that could serve the request is down or draining."""

    def __init__(self, model: str, reason: str) -> None:
        super().__init__(f"no engine available for model {model!r}: {reason}")
        self.model = model
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Preliminary:
    """Outcome of the hard rules: either a final decision, or the pair left to the policy."""

    decision: Decision | None
    pair: PairView


def _load(e: EngineView) -> float:
    # The gateway's own in-flight count is exact; scraped gauges lag. Use the larger.
    running = (e.stats.running or 0.0) + (e.stats.waiting or 0.0)
    return max(float(e.inflight), running)


def choose_pair(view: ModelView) -> PairView:
    """The least-loaded pair with at least one usable engine."""
    if len(view.pairs) == 1:  # the common case: no load to compare
        pair = view.pairs[0]
        if pair.base.usable or (pair.spec is not None and pair.spec.usable):
            return pair
        raise NoEngineAvailable(view.model, "all engines down")
    usable = [p for p in view.pairs if any(e.usable for e in p.engines)]
    if not usable:
        raise NoEngineAvailable(view.model, "all engines down")
    return min(usable, key=lambda p: sum(_load(e) for e in p.engines))


def _engines(pair: PairView, route: Route, *, movable: bool) -> tuple[str, str | None]:
    """The engine of ``route`` on ``pair``, and the sibling it may fall back to."""
    chosen, sibling = (pair.speculative, pair.base) if route is Route.SPEC else (pair.base, pair.spec)
    return chosen.name, sibling.name if movable and sibling is not None and sibling.usable else None


def _decide(pair: PairView, route: Route, reason: Reason, *, movable: bool) -> Decision:
    engine, fallback = _engines(pair, route, movable=movable)
    return Decision(route=route, engine=engine, reason=reason, fallback=fallback)


def apply_hard_rules(features: RequestFeatures, view: ModelView) -> Preliminary:
    pair = choose_pair(view)
    if pair.spec is None:  # the plain engine alone: nothing to choose
        return Preliminary(_decide(pair, Route.BASE, Reason.NO_SPEC, movable=False), pair)
    spec_ok, base_ok = pair.spec.usable, pair.base.usable
    if features.refused_params:
        if not base_ok:
            raise NoEngineAvailable(view.model, "request needs the plain engine, which is down")
        return Preliminary(_decide(pair, Route.BASE, Reason.REFUSED_PARAMS, movable=False), pair)
    if not spec_ok:
        return Preliminary(_decide(pair, Route.BASE, Reason.SPEC_DOWN, movable=False), pair)
    if not base_ok:
        return Preliminary(_decide(pair, Route.SPEC, Reason.BASE_DOWN, movable=False), pair)
    # An operator's pin (POST /admin/route) wins over a client's x-specgate-route header.
    if view.pinned is not RouteOverride.AUTO:
        return Preliminary(_decide(pair, Route(view.pinned.value), Reason.PINNED, movable=True), pair)
    if features.forced is not None:
        return Preliminary(_decide(pair, features.forced, Reason.FORCED, movable=True), pair)
    return Preliminary(None, pair)


def decide_route(
    pair: PairView,
    route: Route,
    reason: Reason,
    *,
    predicted_speedup: float | None = None,
    predicted_acceptance: float | None = None,
    probe: bool = False,
    predicted_tpot_s: float | None = None,
    move_from: Route | None = None,
) -> Decision:
    """Build a policy decision for ``route`` on ``pair`` (retryable on the sibling);
    ``predicted_tpot_s`` is kept only when the request really goes to ``route``."""
    engine, fallback = _engines(pair, route, movable=True)
    return Decision(
        route=route,
        engine=engine,
        reason=reason,
        fallback=fallback,
        predicted_speedup=predicted_speedup,
        predicted_acceptance=predicted_acceptance,
        probe=probe,
        predicted_tpot_s=predicted_tpot_s,
        move_from=move_from,
    )
