"""Gateway configuration: schema (:mod:`gateway.config.models`) and loading (:mod:`gateway.config.loader`)."""

from gateway.config.loader import ConfigError, default_config_text, load_config
from gateway.config.models import (
    EngineConfig,
    GatewayConfig,
    ModelConfig,
    PairConfig,
    RetryConfig,
    ScrapeConfig,
    ServerConfig,
    TimeoutsConfig,
)

__all__ = [
    "ConfigError",
    "EngineConfig",
    "GatewayConfig",
    "ModelConfig",
    "PairConfig",
    "RetryConfig",
    "ScrapeConfig",
    "ServerConfig",
    "TimeoutsConfig",
    "default_config_text",
    "load_config",
]
