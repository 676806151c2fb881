"""Gateway configuration: schema (:mod:`gateway.config.models`, the ``telemetry:`` section in
:mod:`gateway.config.telemetry`) and loading (:mod:`gateway.config.loader`)."""

from gateway.config.loader import ConfigError, default_config_text, load_config
from gateway.config.models import (
    AdviceConfig,
    EngineConfig,
    GatewayConfig,
    ModelConfig,
    PairConfig,
    RetryConfig,
    ScrapeConfig,
    ServerConfig,
    TimeoutsConfig,
)
from gateway.config.telemetry import TelemetryConfig

__all__ = [
    "AdviceConfig",
    "ConfigError",
    "EngineConfig",
    "GatewayConfig",
    "ModelConfig",
    "PairConfig",
    "RetryConfig",
    "ScrapeConfig",
    "ServerConfig",
    "TelemetryConfig",
    "TimeoutsConfig",
    "default_config_text",
    "load_config",
]
