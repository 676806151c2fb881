"""The ``telemetry:`` section of the gateway config, read by :mod:`gateway.telemetry`.

It lives with the config schema (not in the telemetry package) so that loading a config
does not import the metrics and tracing libraries.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator


class TelemetryConfig(BaseModel):
    """Metrics, traces and the access log."""

    model_config = ConfigDict(extra="forbid")

    # The three metrics_* settings apply to apps that mount the endpoint with mount_metrics();
    # the gateway serves GET /metrics itself (protected by server.metrics_require_key).
    metrics: bool = Field(True, description="mount_metrics(): serve Prometheus metrics on metrics_path")
    metrics_path: str = Field("/metrics", description="mount_metrics(): path of the Prometheus endpoint")
    metrics_key: SecretStr | None = Field(
        None,
        description="mount_metrics(): require 'Authorization: Bearer <key>' (Prometheus: "
        "authorization.credentials)",
    )
    process_metrics: bool = Field(True, description="also export process_* and python_* metrics")
    access_log: bool = Field(True, description="one structured log line per request (logger specgate.access)")
    log_format: Literal["text", "json"] = Field("text", description="access log as logfmt text or JSON")
    tracing: Literal["auto", "off"] = Field(
        "auto",
        description="auto: trace when the standard OTEL_* variables ask for an exporter "
        "(OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_ENDPOINT); off: never",
    )
    service_name: str = Field("specgate", description="OpenTelemetry service.name unless OTEL_SERVICE_NAME")
    known_models: tuple[str, ...] | None = Field(
        None, description="model label values; any other model is counted as 'other'"
    )
    max_label_values: int = Field(
        64, ge=1, le=10_000, description="distinct values per free label before values fold into 'other'"
    )

    @field_validator("metrics_path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.startswith("/") or any(c.isspace() for c in v):
            raise ValueError("metrics_path must start with '/' and contain no whitespace")
        return v
