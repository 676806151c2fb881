from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from gateway.routing.types import EngineStats, EngineView, ModelView, PairView, Route, RouteOverride
from gateway.telemetry import GatewayTelemetry, ModelState, TelemetryConfig, mount_metrics
from gateway.telemetry.tracing import TracingConfigError, exporter_names, tracing_from_env
from tests.fakes import FakeClock


def _view() -> ModelView:
    spec = EngineView(
        name="spec-0",
        route=Route.SPEC,
        method="ngram",
        k=3,
        stats=EngineStats(
            acceptance_rate=0.62, mean_acceptance_length=3.1, per_position=(0.8, 0.6, 0.4), tpot_s=0.012
        ),
    )
    base = EngineView(
        name="base-0", route=Route.BASE, stale=True, healthy=False, stats=EngineStats(tpot_s=0.02)
    )
    return ModelView(model="m1", pairs=(PairView(spec=spec, base=base),), pinned=RouteOverride.AUTO)


def _samples(tel: GatewayTelemetry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(tel.exposition().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    return out


def test_routing_state_collector_reads_source_at_scrape_time(tel: GatewayTelemetry) -> None:
    snapshot: dict[str, object] = {
        "policy": "adaptive",
        "mode": "speculate",
        "probe_share": 0.05,
        "break_even_acceptance": 0.31,
        "predicted_speedup": 1.7,
        "hysteresis": 0.1,
        "note": "strings other than mode/policy are not exported",
        "context_tokens": 812,
        "live_acceptance_ratio": 0.93,
        "step_scale": {"spec": 1.1, "base": 0.97, "other": 5.0},
        "probes": 7,
    }
    calls = []

    def source() -> list[ModelState]:
        calls.append(1)
        return [ModelState("m1", _view(), snapshot)]

    tel.set_state_source(source)
    assert calls == []  # nothing read until a scrape
    s = _samples(tel)
    assert calls == [1]
    assert s[("specgate_spec_acceptance_rate", (("engine", "spec-0"), ("model", "m1")))] == 0.62
    assert s[("specgate_spec_mean_acceptance_length", (("engine", "spec-0"), ("model", "m1")))] == 3.1
    assert (
        s[
            (
                "specgate_spec_position_acceptance_rate",
                (("engine", "spec-0"), ("model", "m1"), ("position", "2")),
            )
        ]
        == 0.4
    )
    assert s[("specgate_engine_up", (("engine", "base-0"), ("model", "m1"), ("route", "base")))] == 0
    assert s[("specgate_engine_stale", (("engine", "base-0"), ("model", "m1"), ("route", "base")))] == 1
    assert s[("specgate_routing_mode", (("mode", "speculate"), ("model", "m1")))] == 1
    assert s[("specgate_routing_probe_share", (("model", "m1"),))] == 0.05
    assert s[("specgate_routing_break_even_acceptance_rate", (("model", "m1"),))] == 0.31
    assert s[("specgate_routing_predicted_speedup", (("model", "m1"),))] == 1.7
    assert s[("specgate_routing_context_tokens", (("model", "m1"),))] == 812
    assert s[("specgate_routing_live_acceptance_ratio", (("model", "m1"),))] == 0.93
    assert s[("specgate_routing_step_time_scale", (("model", "m1"), ("route", "spec")))] == 1.1
    assert s[("specgate_routing_step_time_scale", (("model", "m1"), ("route", "base")))] == 0.97
    assert s[("specgate_routing_probes_total", (("model", "m1"),))] == 7
    # No catch-all family: a number without a name of its own is not exported.
    assert not any(name == "specgate_routing_state" or ("key", "hysteresis") in lab for name, lab in s)
    assert ("specgate_routing_mix_tokens_per_step", (("model", "m1"),)) not in s  # absent: no sample
    assert not any(name == "specgate_spec_acceptance_rate" and ("engine", "base-0") in lab for name, lab in s)
    # The state changes between scrapes: the collector shows the new one.
    snapshot["mode"] = "fallback"
    s = _samples(tel)
    assert ("specgate_routing_mode", (("mode", "fallback"), ("model", "m1"))) in s
    assert ("specgate_routing_mode", (("mode", "speculate"), ("model", "m1"))) not in s


def test_broken_state_source_does_not_break_metrics(tel: GatewayTelemetry) -> None:
    def source() -> list[ModelState]:
        raise RuntimeError("boom")

    tel.set_state_source(source)
    names = {name for name, _ in _samples(tel)}
    assert "specgate_engine_scrape_age_seconds" not in names  # no scrapes recorded yet
    assert not any(n.startswith(("specgate_routing_", "specgate_spec_")) for n in names)
    tel.record_scrape("spec-0", True, 0.01)
    assert "specgate_engine_scrapes_total" in {name for name, _ in _samples(tel)}
    assert b"specgate_engine_scrape_age_seconds" in tel.exposition()


def test_scrape_metrics_and_staleness(tel: GatewayTelemetry, clock: FakeClock) -> None:
    tel.record_scrape("spec-0", True, 0.004)
    tel.record_scrape("base-0", False, error="timeout")
    clock.advance(7.0)
    tel.record_scrape("spec-0", False, error="timeout")
    s = _samples(tel)
    assert s[("specgate_engine_scrapes_total", (("engine", "spec-0"), ("result", "ok")))] == 1
    assert s[("specgate_engine_scrapes_total", (("engine", "spec-0"), ("result", "timeout")))] == 1
    assert s[("specgate_engine_scrape_age_seconds", (("engine", "spec-0"),))] == 7.0
    # Never scraped successfully: age counts from the first attempt.
    assert s[("specgate_engine_scrape_age_seconds", (("engine", "base-0"),))] == 7.0


async def _client(tel: GatewayTelemetry, **kw: str) -> TestClient[web.Request, web.Application]:
    app = web.Application()
    mount_metrics(app, tel, **kw)  # type: ignore[arg-type]
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


async def test_metrics_endpoint_open(tel: GatewayTelemetry) -> None:
    client = await _client(tel)
    try:
        resp = await client.get("/metrics")
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        assert (
            "specgate_requests_total" in await resp.text()
            or "# TYPE specgate_requests counter" in await resp.text()
        )
    finally:
        await client.close()


async def test_metrics_endpoint_with_key(clock: FakeClock) -> None:
    tel = GatewayTelemetry(
        TelemetryConfig(process_metrics=False, tracing="off", metrics_key="s3cret", metrics_path="/m"),  # type: ignore[arg-type]
        clock=clock,
    )
    client = await _client(tel)
    try:
        resp = await client.get("/m")
        assert resp.status == 401
        body = await resp.json()
        assert body["error"]["type"] == "authentication_error"
        assert (await client.get("/m", headers={"Authorization": "Bearer wrong"})).status == 401
        ok = await client.get("/m", headers={"Authorization": "Bearer s3cret"})
        assert ok.status == 200
        assert "specgate_engine_scrape_age_seconds" in await ok.text()
    finally:
        await client.close()


def test_otel_env_selection() -> None:
    assert exporter_names({}) == []
    assert exporter_names({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}) == ["otlp"]
    assert exporter_names({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x"}) == []
    assert exporter_names({"OTEL_TRACES_EXPORTER": "console,otlp"}) == ["console", "otlp"]
    assert exporter_names({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}) == []
    assert not tracing_from_env(env={}).enabled
    grpc = tracing_from_env(env={"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    assert grpc.enabled  # OTLP over gRPC (tests/telemetry/test_otlp_grpc.py exports through it)
    grpc.shutdown()
    with pytest.raises(TracingConfigError, match="zipkin"):
        tracing_from_env(env={"OTEL_TRACES_EXPORTER": "zipkin"})
    t = tracing_from_env(env={"OTEL_TRACES_EXPORTER": "console"})
    assert t.enabled
    t.shutdown()


def test_adaptive_policy_snapshot_is_exported(tel: GatewayTelemetry) -> None:
    from gateway.routing.adaptive import AdaptivePolicy
    from gateway.routing.config import RoutingConfig
    from gateway.routing.types import RequestFeatures

    policy = AdaptivePolicy(RoutingConfig(policy="adaptive"))
    view = _view()
    live = ModelView(
        model="m1",
        pairs=(PairView(spec=view.pairs[0].spec, base=EngineView(name="base-0", route=Route.BASE)),),
    )
    for t in range(5):
        policy.decide(
            RequestFeatures(model="m1", temperature=0.0, overlap=0.8, kind="code_edit"), live, float(t)
        )
    tel.set_state_source(lambda: [ModelState("m1", live, policy.snapshot())])
    s = _samples(tel)
    names = {name for name, _ in s}
    assert ("specgate_routing_policy_info", (("model", "m1"), ("policy", "adaptive"))) in s
    assert "specgate_routing_break_even_acceptance_length" in names
    assert "specgate_routing_predicted_speedup" in names
    assert "specgate_routing_probe_share" in names
    assert "specgate_routing_class_mode" in names
    modes = [lab for name, lab in s if name == "specgate_routing_mode"]
    assert len(modes) == 1 and dict(modes[0])["mode"] in {"speculating", "fallback", "mixed"}


def test_the_adaptive_policys_snapshot_feeds_every_named_routing_gauge(tel: GatewayTelemetry) -> None:
    """The named gauges read keys of the policy's public snapshot(): each is there (a renamed
    key would silently drop its gauge), and a fresh policy exports them all."""
    from gateway.routing.config import RoutingConfig
    from gateway.routing.factory import build_policy
    from gateway.telemetry.state import NAMED_GAUGES

    snapshot = build_policy(RoutingConfig(policy="adaptive")).snapshot()
    assert set(NAMED_GAUGES) <= set(snapshot)
    assert set(snapshot["step_scale"]) == {"spec", "base"}  # type: ignore[arg-type]
    tel.set_state_source(lambda: [ModelState("m1", _view(), snapshot)])
    names = {name for name, labels in _samples(tel) if ("model", "m1") in labels}
    assert {name for name, _ in NAMED_GAUGES.values()} <= names
    assert {"specgate_routing_step_time_scale", "specgate_routing_probes_total"} <= names


def test_no_created_series_on_the_gateways_registry_only(tel: GatewayTelemetry) -> None:
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    tel.record_scrape("spec-0", True, 0.01)
    page = tel.exposition().decode()
    assert "specgate_engine_scrapes_total" in page and "specgate_engine_scrape_duration_seconds_count" in page
    assert "_created" not in page
    other = CollectorRegistry()
    Counter("vllm_like", "an engine's counter in the same process", registry=other).inc()
    assert b"vllm_like_created" in generate_latest(other)  # prometheus_client's default kept elsewhere
