"""The registry of routing policies: what builds each name a model's ``routing.policy``
may take (:mod:`gateway.routing.names`).

:data:`POLICIES` maps every name of :data:`~gateway.routing.names.POLICY_NAMES` to its
builder; the config's policy type and the command lines' ``--policy`` choices derive from
the names, and a policy is added in both places (an import-time check keeps them equal).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final, TypeAlias

from gateway.routing.adaptive import AdaptivePolicy
from gateway.routing.config import RoutingConfig
from gateway.routing.names import (
    ADAPTIVE,
    ALWAYS_BASE,
    ALWAYS_SPEC,
    POLICY_NAMES,
    STATIC_BASELINES,
    TEMPERATURE,
    PolicyName,
)
from gateway.routing.static import FixedPolicy, TemperaturePolicy
from gateway.routing.types import Policy, Route

__all__ = [
    "ADAPTIVE",
    "ALWAYS_BASE",
    "ALWAYS_SPEC",
    "POLICIES",
    "POLICY_NAMES",
    "STATIC_BASELINES",
    "TEMPERATURE",
    "PolicyBuilder",
    "PolicyName",
    "build_policy",
]

PolicyBuilder: TypeAlias = Callable[[RoutingConfig], Policy]


def _adaptive(cfg: RoutingConfig) -> Policy:
    return AdaptivePolicy(cfg)


def _always_spec(cfg: RoutingConfig) -> Policy:
    return FixedPolicy(Route.SPEC)


def _always_base(cfg: RoutingConfig) -> Policy:
    return FixedPolicy(Route.BASE)


def _temperature(cfg: RoutingConfig) -> Policy:
    return TemperaturePolicy(max_temperature=cfg.max_temperature)


# name -> constructor, in the order the names are listed to users.
POLICIES: Final[Mapping[str, PolicyBuilder]] = MappingProxyType(
    {
        ADAPTIVE: _adaptive,
        ALWAYS_SPEC: _always_spec,
        ALWAYS_BASE: _always_base,
        TEMPERATURE: _temperature,
    }
)
if tuple(POLICIES) != POLICY_NAMES:  # pragma: no cover - a policy added in one place only
    raise RuntimeError(f"policy builders {tuple(POLICIES)} differ from the names {POLICY_NAMES}")


def build_policy(cfg: RoutingConfig) -> Policy:
    """The policy ``cfg.policy`` names, built from ``cfg``."""
    return POLICIES[cfg.policy](cfg)
