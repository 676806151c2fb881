"""OTLP over http/protobuf, configured by the standard OTEL_* variables, to a local receiver."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.routing.types import Decision, RequestFeatures, Route
from gateway.telemetry import TelemetryConfig, build_telemetry

pytest.importorskip(
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    reason="pip install 'specgate[otlp]' (opentelemetry-exporter-otlp-proto-http)",
)


async def test_spans_reach_an_otlp_http_receiver(monkeypatch: pytest.MonkeyPatch) -> None:
    bodies: list[tuple[str, str, bytes]] = []
    got = asyncio.Event()

    async def traces(request: web.Request) -> web.Response:
        bodies.append((request.path, request.content_type, await request.read()))
        got.set()
        return web.Response(status=200, content_type="application/x-protobuf", body=b"")

    app = web.Application()
    app.router.add_post("/v1/traces", traces)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.port}")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "specgate-test")
        monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
        monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
        # Built off the loop: the exporter sets up its HTTP session (TLS trust store).
        tel = await asyncio.to_thread(
            build_telemetry, TelemetryConfig(process_metrics=False, access_log=False)
        )
        assert tel.tracing.enabled
        rt = tel.start_request("m1", "chat", "r1", {})
        rt.decided(
            RequestFeatures(model="m1"), Decision(route=Route.BASE, engine="base0", reason="prior"), 1e-4
        )
        rt.upstream_started("base0", 0)
        rt.upstream_first_byte("base0")
        rt.finished(200, completion_tokens=3)
        await tel.aclose()  # flushes the batch processor (in a worker thread)
        await asyncio.wait_for(got.wait(), 10)
    finally:
        await server.close()
    path, ctype, _ = bodies[0]
    assert path == "/v1/traces" and ctype == "application/x-protobuf"
    data = b"".join(b for _, _, b in bodies)
    for needle in (b"POST /v1/chat/completions", b"upstream base0", b"specgate-test", b"specgate.reason"):
        assert needle in data
