from __future__ import annotations

import json
import logging

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client.parser import text_string_to_metric_families

from gateway.routing.types import Decision, RequestFeatures, Route
from gateway.telemetry import GatewayTelemetry, TelemetryConfig
from gateway.telemetry.logs import ACCESS_LOGGER
from tests.fakes import FakeClock

SPEC = Decision(
    route=Route.SPEC,
    engine="spec-0",
    reason="low_temperature",
    fallback="base-0",
    predicted_speedup=1.8,
    predicted_acceptance=0.7,
)
FEATURES = RequestFeatures(model="m1", temperature=0.0, kind="code_edit", overlap=0.6)
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def sample(tel: GatewayTelemetry, name: str, **labels: str) -> float | None:
    for fam in text_string_to_metric_families(tel.exposition().decode()):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


def serve_one(
    tel: GatewayTelemetry, clock: FakeClock, *, tokens: int = 11, headers: dict[str, str] | None = None
) -> dict[str, str]:
    rt = tel.start_request("m1", "/v1/chat/completions", "req-1", headers or {})
    clock.advance(0.0)
    rt.decided(FEATURES, SPEC, 0.0002)
    out = dict(rt.upstream_started("spec-0", 0))
    clock.advance(0.05)
    rt.upstream_first_byte("spec-0")
    clock.advance(0.05)
    rt.first_token()
    clock.advance(0.2)
    rt.finished(200, prompt_tokens=30, completion_tokens=tokens)
    return out


def test_success_counts_and_timings(tel: GatewayTelemetry, clock: FakeClock) -> None:
    serve_one(tel, clock)
    labels = dict(
        model="m1", endpoint="/v1/chat/completions", route="spec", reason="low_temperature", status="200"
    )
    assert sample(tel, "specgate_requests_total", **labels) == 1
    # TTFT 0.1 s lands in the 0.1 bucket, not in 0.075.
    assert sample(tel, "specgate_time_to_first_token_seconds_bucket", model="m1", route="spec", le="0.1") == 1
    assert (
        sample(tel, "specgate_time_to_first_token_seconds_bucket", model="m1", route="spec", le="0.075") == 0
    )
    # TPOT = 0.2 s / (11 - 1) tokens = 20 ms.
    assert sample(
        tel, "specgate_time_per_output_token_seconds_sum", model="m1", route="spec"
    ) == pytest.approx(0.02)
    assert sample(tel, "specgate_request_duration_seconds_sum", model="m1", route="spec") == pytest.approx(
        0.3
    )
    assert sample(tel, "specgate_output_tokens_total", model="m1", route="spec") == 11
    assert sample(tel, "specgate_upstream_time_to_first_byte_seconds_sum", engine="spec-0") == pytest.approx(
        0.05
    )
    assert sample(tel, "specgate_decision_duration_seconds_count", model="m1") == 1
    assert sample(tel, "specgate_upstream_inflight_requests", engine="spec-0") == 0


def test_inflight_tracks_attempts(tel: GatewayTelemetry, clock: FakeClock) -> None:
    rt = tel.start_request("m1", "/v1/completions", "r", {})
    rt.decided(FEATURES, SPEC, 0.0)
    rt.upstream_started("spec-0", 0)
    assert sample(tel, "specgate_upstream_inflight_requests", engine="spec-0") == 1
    rt.upstream_failed("spec-0", "connect", retried=True)
    assert sample(tel, "specgate_upstream_inflight_requests", engine="spec-0") == 0
    rt.upstream_started("base-0", 1)
    assert sample(tel, "specgate_upstream_inflight_requests", engine="base-0") == 1
    rt.finished(502, error="upstream_unavailable")
    rt.finished(200)  # a second call is ignored
    assert sample(tel, "specgate_upstream_inflight_requests", engine="base-0") == 0
    assert sample(tel, "specgate_upstream_failures_total", engine="spec-0", error="connect") == 1
    assert sample(tel, "specgate_upstream_retries_total", engine="spec-0", error="connect") == 1
    assert sample(tel, "specgate_requests_total", status="502", route="spec") == 1
    assert sample(tel, "specgate_requests_total", status="200") is None
    # Failed requests have no TTFT sample.
    assert sample(tel, "specgate_time_to_first_token_seconds_count", route="spec") is None


def test_request_before_decision_is_labelled_none(tel: GatewayTelemetry) -> None:
    rt = tel.start_request("m1", "/v1/chat/completions", "r", {})
    rt.finished(400, error="invalid_request")
    assert sample(tel, "specgate_requests_total", route="none", reason="none", status="400") == 1


def test_label_cardinality_is_bounded(tel: GatewayTelemetry) -> None:
    for i in range(200):
        rt = tel.start_request(f"client-invented-model-{i}", "/v1/chat/completions", f"id-{i}", {})
        rt.decided(FEATURES, Decision(route=Route.BASE, engine=f"e{i}", reason=f"r{i}"), 0.0)
        rt.upstream_started(f"e{i}", 0)
        rt.upstream_failed(f"e{i}", f"weird error {i}", retried=False)
        rt.finished(999)
    text = tel.exposition().decode()
    assert "client-invented-model" not in text  # not in known_models: folded into "other"
    assert "id-1" not in text  # request ids are never labels
    reasons = {
        s.labels["reason"]
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == "specgate_requests_total"
    }
    assert len(reasons) <= tel.config.max_label_values + 1
    assert "other" in reasons
    assert sample(tel, "specgate_requests_total", model="other", status="other") is not None


def test_spans_and_traceparent(tel: GatewayTelemetry, clock: FakeClock, spans: InMemorySpanExporter) -> None:
    injected = serve_one(tel, clock, headers={"Traceparent": TRACEPARENT})
    finished = {s.name: s for s in spans.get_finished_spans()}
    server = finished["POST /v1/chat/completions"]
    client = finished["upstream spec-0"]
    assert server.kind is SpanKind.SERVER and client.kind is SpanKind.CLIENT
    # The server span continues the client's trace; the engine gets the client span as parent.
    assert server.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert server.parent is not None and server.parent.span_id == 0xB7AD6B7169203331
    assert client.parent is not None and client.parent.span_id == server.context.span_id
    assert injected["traceparent"] == f"00-{server.context.trace_id:032x}-{client.context.span_id:016x}-01"
    attrs = server.attributes or {}
    assert attrs["specgate.route"] == "spec"
    assert attrs["specgate.reason"] == "low_temperature"
    assert attrs["specgate.predicted_speedup"] == 1.8
    assert attrs["specgate.predicted_acceptance"] == 0.7
    assert attrs["http.response.status_code"] == 200
    assert (client.attributes or {})["specgate.upstream.time_to_first_byte_s"] == pytest.approx(0.05)
    assert [e.name for e in client.events] == ["first_byte"]


def test_failed_attempt_span_has_error(tel: GatewayTelemetry, spans: InMemorySpanExporter) -> None:
    rt = tel.start_request("m1", "/v1/chat/completions", "r", {})
    rt.decided(FEATURES, SPEC, 0.0)
    rt.upstream_started("spec-0", 0)
    rt.upstream_failed("spec-0", "first_byte_timeout", retried=True)
    rt.upstream_started("base-0", 1)
    rt.finished(200, completion_tokens=1)
    by_name = {s.name: s for s in spans.get_finished_spans()}
    assert by_name["upstream spec-0"].status.status_code is StatusCode.ERROR
    assert by_name["upstream base-0"].status.status_code is StatusCode.UNSET


def test_tracing_off_passes_traceparent_through(clock: FakeClock) -> None:
    tel = GatewayTelemetry(TelemetryConfig(process_metrics=False, tracing="off"), clock=clock)
    assert not tel.tracing.enabled
    rt = tel.start_request("m1", "/v1/chat/completions", "r", {"traceparent": TRACEPARENT})
    assert rt.upstream_started("e", 0) == {"traceparent": TRACEPARENT}
    rt2 = tel.start_request("m1", "/v1/chat/completions", "r", {"traceparent": "garbage"})
    assert rt2.upstream_started("e", 0) == {}
    rt.finished(200)
    rt2.finished(200)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_access_log_line(fmt: str, clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    tel = GatewayTelemetry(
        TelemetryConfig(process_metrics=False, tracing="off", log_format=fmt),  # type: ignore[arg-type]
        clock=clock,
    )
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    serve_one(tel, clock)
    lines = [r.getMessage() for r in caplog.records if r.name == ACCESS_LOGGER]
    assert len(lines) == 1
    line = lines[0]
    if fmt == "json":
        rec = json.loads(line)
        assert rec["route"] == "spec" and rec["reason"] == "low_temperature" and rec["status"] == 200
        assert rec["ttft_ms"] == pytest.approx(100.0)
    else:
        assert "route=spec" in line and "reason=low_temperature" in line and "status=200" in line
        assert "request_id=req-1" in line


def test_access_log_can_be_disabled(clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    tel = GatewayTelemetry(
        TelemetryConfig(process_metrics=False, tracing="off", access_log=False), clock=clock
    )
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    serve_one(tel, clock)
    assert not [r for r in caplog.records if r.name == ACCESS_LOGGER]


def test_a_reasoning_answer_times_its_first_token_and_its_first_content_apart(
    tel: GatewayTelemetry, clock: FakeClock, spans: InMemorySpanExporter
) -> None:
    """TTFT at the first reasoning token, the first content 2 s later, TPOT over every token
    from the first, and the reasoning tokens as a metric and a GenAI span attribute."""
    rt = tel.start_request("m1", "/v1/chat/completions", "req-r", {})
    rt.decided(FEATURES, SPEC, 0.0002)
    rt.upstream_started("spec-0", 0)
    clock.advance(0.05)
    rt.first_token()  # a reasoning delta
    clock.advance(2.0)
    rt.first_content()
    rt.first_token()  # later calls change nothing
    clock.advance(1.0)
    rt.reasoning_tokens(100)
    rt.finished(200, prompt_tokens=30, completion_tokens=151)
    assert sample(tel, "specgate_time_to_first_token_seconds_sum", route="spec") == pytest.approx(0.05)
    assert sample(tel, "specgate_time_to_first_content_seconds_sum", route="spec") == pytest.approx(2.05)
    assert sample(tel, "specgate_time_per_output_token_seconds_sum", route="spec") == pytest.approx(0.02)
    assert sample(tel, "specgate_reasoning_tokens_total", model="m1", route="spec") == 100
    assert sample(tel, "specgate_output_tokens_total", model="m1", route="spec") == 151
    server = {s.name: s for s in spans.get_finished_spans()}["POST /v1/chat/completions"]
    attrs = server.attributes or {}
    assert attrs["gen_ai.usage.reasoning.output_tokens"] == 100
    assert attrs["gen_ai.usage.output_tokens"] == 151
    assert attrs["specgate.ttft_s"] == pytest.approx(0.05)
    assert attrs["specgate.time_to_first_content_s"] == pytest.approx(2.05)
    assert [e.name for e in server.events][-2:] == ["first_token", "first_content"]
