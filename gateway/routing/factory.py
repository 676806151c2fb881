"""The one place that turns a model's routing config into a policy object."""

from __future__ import annotations

from gateway.routing.adaptive import AdaptivePolicy
from gateway.routing.config import RoutingConfig
from gateway.routing.static import FixedPolicy, TemperaturePolicy
from gateway.routing.types import Policy, Route


def build_policy(cfg: RoutingConfig) -> Policy:
    if cfg.policy == "always-spec":
        return FixedPolicy(Route.SPEC)
    if cfg.policy == "always-base":
        return FixedPolicy(Route.BASE)
    if cfg.policy == "adaptive":
        return AdaptivePolicy(cfg)
    return TemperaturePolicy(max_temperature=cfg.max_temperature)
