"""Telemetry: Prometheus metrics, OpenTelemetry traces and structured logs.

The request path talks to telemetry only through :mod:`gateway.telemetry.hooks`.
The gateway builds it with :func:`build_telemetry`, serves ``/metrics`` with
:func:`mount_metrics`, points the routing-state collector at its model runtimes with
``GatewayTelemetry.set_state_source`` and lets the engine scraper report each scrape
through ``GatewayTelemetry.record_scrape``.
"""

from gateway.config.telemetry import TelemetryConfig
from gateway.telemetry.hooks import NullTelemetry, RequestTelemetry, Telemetry
from gateway.telemetry.http import TELEMETRY_KEY, mount_metrics
from gateway.telemetry.service import GatewayTelemetry, build_telemetry
from gateway.telemetry.state import ModelState, StateSource
from gateway.telemetry.wiring import (
    attach_models,
    runtime_state_source,
    scrape_listener,
    with_scrape_telemetry,
)

__all__ = [
    "TELEMETRY_KEY",
    "GatewayTelemetry",
    "ModelState",
    "NullTelemetry",
    "RequestTelemetry",
    "StateSource",
    "Telemetry",
    "TelemetryConfig",
    "attach_models",
    "build_telemetry",
    "mount_metrics",
    "runtime_state_source",
    "scrape_listener",
    "with_scrape_telemetry",
]
