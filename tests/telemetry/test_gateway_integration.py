"""Telemetry inside the real gateway app, driven by the real OpenAI SDK."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client.parser import text_string_to_metric_families

from gateway.telemetry import GatewayTelemetry, TelemetryConfig
from gateway.telemetry.tracing import tracing_with_exporter
from tests.proxy.fake_engine import FakeEngine
from tests.proxy.harness import harness

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"


def _tel(spans: InMemorySpanExporter) -> GatewayTelemetry:
    return GatewayTelemetry(
        TelemetryConfig(process_metrics=False, known_models=("m1",)), tracing=tracing_with_exporter(spans)
    )


def _value(text: str, name: str, **labels: str) -> float | None:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


async def test_streamed_request_metrics_spans_and_traceparent_to_engine() -> None:
    spans = InMemorySpanExporter()
    tel = _tel(spans)
    spec = FakeEngine("m1-spec")
    async with harness(spec=spec, telemetry=tel) as h:
        # Built off the loop: the SDK loads its TLS trust store when it is created.
        client = await asyncio.to_thread(
            openai.AsyncOpenAI, base_url=h.openai_base, api_key="none", max_retries=0
        )
        try:
            stream = await client.chat.completions.create(
                model="m1",
                messages=[{"role": "user", "content": "say hello"}],
                temperature=0.0,
                stream=True,
                stream_options={"include_usage": True},
                extra_headers={"traceparent": TRACEPARENT},
            )
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        finally:
            await client.close()
        assert text == "Hello, world!"
        async with aiohttp.ClientSession() as session, session.get(h.url("/metrics")) as resp:
            assert resp.status == 200
            metrics = await resp.text()
    # Engine got the client span's context, in the client's trace.
    sent = spec.requests[0].headers["traceparent"]
    by_name = {s.name: s for s in spans.get_finished_spans()}
    server = by_name["POST /v1/chat/completions"]
    upstream = by_name["upstream spec0"]
    assert server.kind is SpanKind.SERVER and upstream.kind is SpanKind.CLIENT
    assert f"{server.context.trace_id:032x}" == CLIENT_TRACE
    assert sent == f"00-{CLIENT_TRACE}-{upstream.context.span_id:016x}-01"
    attrs = server.attributes or {}
    assert attrs["specgate.route"] == "spec" and attrs["specgate.reason"] == "low_temperature"
    assert "specgate.upstream.time_to_first_byte_s" in (upstream.attributes or {})
    # Metrics of the same request.
    labels = {"model": "m1", "route": "spec", "reason": "low_temperature", "status": "200"}
    assert _value(metrics, "specgate_requests_total", **labels) == 1
    assert _value(metrics, "specgate_time_to_first_token_seconds_count", model="m1", route="spec") == 1
    assert _value(metrics, "specgate_upstream_inflight_requests", engine="spec0") == 0
    # Live routing state of the model is exported (the temperature policy has no break-even).
    assert _value(metrics, "specgate_routing_policy_info", model="m1", policy="temperature") == 1
    assert _value(metrics, "specgate_engine_up", model="m1", engine="spec0", route="spec") == 1
    # No *_created series beside the counters and histograms (the app's own /metrics).
    assert [line for line in metrics.splitlines() if "_created" in line] == []


async def test_failover_counts_retry_and_marks_attempt_span() -> None:
    spans = InMemorySpanExporter()
    tel = _tel(spans)
    spec = FakeEngine("m1-spec", status=503)
    async with harness(spec=spec, telemetry=tel) as h:
        # Built off the loop: the SDK loads its TLS trust store when it is created.
        client = await asyncio.to_thread(
            openai.AsyncOpenAI, base_url=h.openai_base, api_key="none", max_retries=0
        )
        try:
            reply = await client.chat.completions.create(
                model="m1", messages=[{"role": "user", "content": "hi"}], temperature=0.0
            )
        finally:
            await client.close()
        assert reply.choices[0].message.content == "Hello, world!"
    text = tel.exposition().decode()
    assert _value(text, "specgate_upstream_retries_total", engine="spec0", error="status_5xx") == 1
    assert _value(text, "specgate_upstream_failures_total", engine="spec0", error="status_5xx") == 1
    by_name = {s.name: s for s in spans.get_finished_spans()}
    assert by_name["upstream spec0"].status.status_code is StatusCode.ERROR
    assert by_name["upstream base0"].status.status_code is StatusCode.UNSET
    assert (by_name["POST /v1/chat/completions"].attributes or {})["specgate.attempts"] == 2
