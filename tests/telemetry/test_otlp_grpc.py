"""``specgate serve`` with ``OTEL_EXPORTER_OTLP_PROTOCOL=grpc``, as operators inject it: it
starts, and its spans reach a real OTLP/gRPC receiver (the collector's trace service,
built on the ``opentelemetry-proto`` stubs and grpcio) over a real socket. Without the gRPC
exporter it still starts, with a warning and tracing off."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml

from gateway.api.state import STATE
from gateway.telemetry.tracing import tracing_from_env
from specgate_lab.bench.procs import start_serve
from tests.proxy.harness import harness

grpc = pytest.importorskip("grpc")
pytest.importorskip(
    "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
    reason="pip install 'specgate[otlp]' (opentelemetry-exporter-otlp-proto-grpc)",
)
from opentelemetry.proto.collector.trace.v1 import (  # noqa: E402
    trace_service_pb2,
    trace_service_pb2_grpc,
)

pytestmark = pytest.mark.timeout(90)


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
    """The OTLP trace service of a collector: keeps what it is sent."""

    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.got = asyncio.Event()

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: object
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self.requests.append(request)
        self.got.set()
        return trace_service_pb2.ExportTraceServiceResponse()


def _config(tmp_path: Path, spec_url: str, base_url: str) -> Path:
    cfg = {
        "server": {"host": "127.0.0.1", "port": 0},
        "scrape": {"enabled": False},
        "models": [
            {
                "name": "m1",
                "routing": {"policy": "temperature"},
                "pairs": [
                    {
                        "spec": {"name": "s", "url": spec_url, "served_model_name": "m1-spec"}
                        | {"method": "ngram", "k": 3},
                        "base": {"name": "b", "url": base_url, "served_model_name": "m1-base"},
                    }
                ],
            }
        ],
    }
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


async def test_serve_exports_spans_over_otlp_grpc(tmp_path: Path) -> None:
    receiver = Receiver()
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with harness() as h:
        engines = h.app[STATE].models["m1"].engines
        path = _config(tmp_path, engines["spec0"].config.url, engines["base0"].config.url)
        env = {
            **os.environ,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_SERVICE_NAME": "specgate-grpc-test",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        for key in ("OTEL_TRACES_EXPORTER", "OTEL_SDK_DISABLED", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
            env.pop(key, None)
        proc, url = await start_serve(path, log_level="WARNING", env=env)
        try:
            body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.9}
            async with aiohttp.ClientSession() as s, s.post(url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200
            await asyncio.wait_for(receiver.got.wait(), 30)
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 30) == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            await server.stop(None)
    spans = [
        (span.name, resource.resource)
        for req in receiver.requests
        for resource in req.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]
    names = {name for name, _ in spans}
    assert "POST /v1/chat/completions" in names and any(n.startswith("upstream ") for n in names)
    service = {a.value.string_value for _, res in spans for a in res.attributes if a.key == "service.name"}
    assert service == {"specgate-grpc-test"}


def test_a_missing_or_unknown_exporter_is_a_warning_and_tracing_off(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import builtins

    real_import = builtins.__import__

    def no_grpc_exporter(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("opentelemetry.exporter.otlp.proto.grpc"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    caplog.set_level(logging.WARNING, logger="specgate.telemetry")
    for key in [k for k in sys.modules if k.startswith("opentelemetry.exporter.otlp.proto.grpc")]:
        monkeypatch.delitem(sys.modules, key)
    monkeypatch.setattr(builtins, "__import__", no_grpc_exporter)
    env = {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    assert not tracing_from_env(env=env).enabled
    assert "opentelemetry-exporter-otlp-proto-grpc is not installed" in caplog.text
    monkeypatch.setattr(builtins, "__import__", real_import)
    caplog.clear()
    assert not tracing_from_env(env={**env, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}).enabled
    assert "not supported" in caplog.text
    both = tracing_from_env(
        env={**env, "OTEL_TRACES_EXPORTER": "otlp,console", "OTEL_EXPORTER_OTLP_PROTOCOL": "x"}
    )
    assert both.enabled  # the console exporter still runs
    both.shutdown()
