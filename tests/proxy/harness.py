"""Gateway + two fake engines on ephemeral ports, for tests/proxy and tests/api."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.api.app import build_app
from gateway.config import GatewayConfig
from gateway.routing.types import Policy
from gateway.telemetry.hooks import Telemetry
from tests.proxy.fake_engine import FakeEngine


def gateway_config(spec_url: str, base_url: str, **over: Any) -> GatewayConfig:
    server = {"port": 0, **over.pop("server", {})}
    model: dict[str, Any] = {
        "name": "m1",
        "pairs": [
            {
                "device": "gpu0",
                "spec": {
                    "name": "spec0",
                    "url": spec_url,
                    "served_model_name": "m1-spec",
                    "method": "ngram",
                    "k": 5,
                },
                "base": {"name": "base0", "url": base_url, "served_model_name": "m1-base"},
            }
        ],
        "timeouts": {"connect_s": 1.0, "first_byte_s": 5.0, "idle_s": 5.0, "total_s": 20.0},
        # Tests force routes with x-specgate-route: the operator here allows it (off by default).
        "routing": {"policy": "temperature", "max_temperature": 0.3, "allow_client_override": True},
    }
    for key in ("timeouts", "retry", "routing"):
        if key in over:
            model[key] = {**model.get(key, {}), **over.pop(key)}
    model.update(over.pop("model", {}))
    extra_models = over.pop("extra_models", [])
    data = {"server": server, "scrape": {"enabled": False}, "models": [model, *extra_models], **over}
    return GatewayConfig.model_validate(data)


@dataclass
class Harness:
    spec: FakeEngine
    base: FakeEngine
    gateway: TestServer
    app: web.Application

    def url(self, path: str = "") -> str:
        return str(self.gateway.make_url(path))

    @property
    def openai_base(self) -> str:
        return self.url("/v1")


@asynccontextmanager
async def harness(
    *,
    spec: FakeEngine | None = None,
    base: FakeEngine | None = None,
    spec_url: str | None = None,
    base_url: str | None = None,
    telemetry: Telemetry | None = None,
    policies: Mapping[str, Policy] | None = None,
    **over: Any,
) -> AsyncIterator[Harness]:
    spec = spec or FakeEngine("m1-spec")
    base = base or FakeEngine("m1-base")
    s_srv, b_srv = TestServer(spec.app()), TestServer(base.app())
    await s_srv.start_server()
    await b_srv.start_server()
    try:
        cfg = gateway_config(spec_url or str(s_srv.make_url("")), base_url or str(b_srv.make_url("")), **over)
        app = build_app(cfg, telemetry=telemetry, policies=policies)
        gw = TestServer(app)
        await gw.start_server()
        try:
            yield Harness(spec, base, gw, app)
        finally:
            await gw.close()
    finally:
        await s_srv.close()
        await b_srv.close()
