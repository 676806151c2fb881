"""The registry of routing policies: every name a model's ``routing.policy`` may take, and what builds it.

:data:`POLICIES` is the one list of policy names. The config's policy type
(:data:`PolicyName`, used by :class:`~gateway.routing.config.RoutingConfig`) and the
command lines' ``--policy`` choices derive from it; a policy added here is accepted
everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Final, TypeAlias

from pydantic import BeforeValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

from gateway.routing.static import FixedPolicy, TemperaturePolicy
from gateway.routing.types import Policy, Route

if TYPE_CHECKING:
    from gateway.routing.config import RoutingConfig

PolicyBuilder: TypeAlias = Callable[["RoutingConfig"], Policy]

ADAPTIVE: Final = "adaptive"
ALWAYS_SPEC: Final = "always-spec"
ALWAYS_BASE: Final = "always-base"
TEMPERATURE: Final = "temperature"
# The two static baselines the adaptive policy is measured against.
STATIC_BASELINES: Final = (ALWAYS_SPEC, ALWAYS_BASE)


def _adaptive(cfg: RoutingConfig) -> Policy:
    # Imported when built: the adaptive policy reads RoutingConfig, whose policy type reads this module.
    from gateway.routing.adaptive import AdaptivePolicy

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
POLICY_NAMES: Final[tuple[str, ...]] = tuple(POLICIES)


def _registered(name: object) -> object:
    if not isinstance(name, str) or name not in POLICIES:
        quoted = [repr(n) for n in POLICY_NAMES]
        raise PydanticCustomError(
            "literal_error",
            "Input should be {expected}",
            {"expected": f"{', '.join(quoted[:-1])} or {quoted[-1]}"},
        )
    return name


# The config's policy field: a registered name (validated, and listed in the JSON schema).
PolicyName: TypeAlias = Annotated[
    str,
    BeforeValidator(_registered),
    WithJsonSchema({"enum": list(POLICY_NAMES), "type": "string"}),
]


def build_policy(cfg: RoutingConfig) -> Policy:
    """The policy ``cfg.policy`` names, built from ``cfg``."""
    return POLICIES[cfg.policy](cfg)
