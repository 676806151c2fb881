from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.telemetry import GatewayTelemetry, TelemetryConfig
from gateway.telemetry.tracing import tracing_with_exporter
from tests.fakes import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def spans() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tel(clock: FakeClock, spans: InMemorySpanExporter) -> Iterator[GatewayTelemetry]:
    t = GatewayTelemetry(
        TelemetryConfig(process_metrics=False, known_models=("m1",)),
        tracing=tracing_with_exporter(spans),
        clock=clock,
    )
    yield t
    t.tracing.shutdown()
