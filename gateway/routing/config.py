"""Routing configuration of one model (embedded in the gateway config under each model)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

PolicyName = Literal["adaptive", "always-spec", "always-base", "temperature"]


class RoutingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy: PolicyName = Field(
        "temperature",
        description="adaptive: the cost model; always-spec / always-base: static baselines; "
        "temperature: speculate at or below max_temperature",
    )
    max_temperature: float = Field(0.3, ge=0.0, le=2.0, description="threshold of the temperature policy")
    allow_client_override: bool = Field(
        True, description="honour the x-specgate-route: auto|spec|base request header"
    )
