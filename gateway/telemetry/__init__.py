"""Telemetry: Prometheus metrics, OpenTelemetry traces and structured logs.

The request path talks to telemetry only through :mod:`gateway.telemetry.hooks`.
"""
