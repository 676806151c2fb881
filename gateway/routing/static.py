"""Static policies: always one engine, or a temperature threshold. Baselines for benchmarks."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.routing.rules import apply_hard_rules, decide_route
from gateway.routing.types import Decision, ModelView, Outcome, Reason, RequestFeatures, Route


@dataclass
class FixedPolicy:
    """Send everything the hard rules allow to one route."""

    route: Route
    name: str = "fixed"

    def __post_init__(self) -> None:
        self.name = f"always-{self.route.value}"

    def decide(self, features: RequestFeatures, view: ModelView, now: float) -> Decision:
        pre = apply_hard_rules(features, view)
        if pre.decision is not None:
            return pre.decision
        return decide_route(pre.pair, self.route, Reason.STATIC)

    def observe(self, outcome: Outcome, now: float) -> None:
        return None

    def snapshot(self) -> dict[str, object]:
        return {"policy": self.name}


@dataclass
class TemperaturePolicy:
    """Speculate at or below a temperature threshold, plain above it."""

    max_temperature: float = 0.3
    name: str = "temperature"

    def decide(self, features: RequestFeatures, view: ModelView, now: float) -> Decision:
        pre = apply_hard_rules(features, view)
        if pre.decision is not None:
            return pre.decision
        if features.temperature <= self.max_temperature:
            return decide_route(pre.pair, Route.SPEC, Reason.LOW_TEMPERATURE)
        return decide_route(pre.pair, Route.BASE, Reason.HIGH_TEMPERATURE)

    def observe(self, outcome: Outcome, now: float) -> None:
        return None

    def snapshot(self) -> dict[str, object]:
        return {"policy": self.name}
