"""A real gateway app in front of a real emulated engine pair, on ephemeral ports.

``rig()`` starts the emulated spec+base pair (one shared device timeline, emulated time
sped up), builds the gateway from a config pointing at it (scraping and active health
checks on, fast intervals), and serves it with aiohttp's ``TestServer``. Helpers change
fault knobs, crash and restart an engine, and wait for conditions with a deadline (never
a fixed sleep).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.api.app import build_app
from gateway.api.state import STATE, GatewayState
from gateway.config import GatewayConfig
from gateway.engines.runtime import EngineRuntime
from gateway.telemetry import GatewayTelemetry, TelemetryConfig
from specgate_lab.bench.procs import emulated_pair_model
from specgate_lab.emulator.launch import EmulatorGroup, RunningEngine, pair_launches, start_group

SPEC, BASE = "qwen3-8b-spec", "qwen3-8b-base"
COPY_PROMPT = (
    "Return this code unchanged except rename foo to bar:\n```python\n"
    + "\n".join(f"def foo_{i}(x):\n    return x * {i} + foo_{i}(x - 1)" for i in range(12))
    + "\n```"
)


def chat(content: str = "Tell me about the sea.", **extra: Any) -> dict[str, Any]:
    return {"model": "m1", "messages": [{"role": "user", "content": content}], **extra}


def gateway_config(spec_url: str, base_url: str, **over: Any) -> GatewayConfig:
    model = emulated_pair_model(
        spec_url,
        base_url,
        spec_served=SPEC,
        base_served=BASE,
        device="gpu0",
        timeouts={"connect_s": 1.0, "first_byte_s": 5.0, "idle_s": 5.0, "total_s": 30.0},
        retry={"failures_to_unhealthy": 3, "cooldown_s": 0.5},
        # Tests force routes with x-specgate-route: the operator here allows it (off by default).
        routing={"policy": "temperature", "max_temperature": 0.3, "allow_client_override": True},
    )
    for key in ("timeouts", "retry", "routing"):
        model[key] = {**model[key], **over.pop(key, {})}
    data: dict[str, Any] = {
        "server": {"port": 0, **over.pop("server", {})},
        "scrape": {
            "enabled": True,
            "interval_s": 0.05,
            "timeout_s": 0.2,
            "stale_after_s": 0.5,
            **over.pop("scrape", {}),
        },
        "models": [model],
        **over,
    }
    return GatewayConfig.model_validate(data)


@dataclass
class Rig:
    group: EmulatorGroup
    gateway: TestServer
    app: web.Application
    telemetry: GatewayTelemetry

    def url(self, path: str = "") -> str:
        return str(self.gateway.make_url(path))

    @property
    def state(self) -> GatewayState:
        return self.app[STATE]

    def engine(self, name: str) -> EngineRuntime:
        return self.state.models["m1"].engines[name]

    def emulated(self, served: str) -> RunningEngine:
        return self.group.by_name(served)

    def faults(self, served: str, **knobs: Any) -> None:
        self.emulated(served).handle.set_faults(knobs)

    async def crash(self, served: str) -> None:
        await self.emulated(served).handle.crash()

    async def restart(self, served: str) -> None:
        """Bring a crashed engine back on the same port, like a supervisor restarting it."""
        await self.emulated(served).restart(fresh_state=False)


@asynccontextmanager
async def rig(*, time_scale: float = 0.02, **over: Any) -> AsyncIterator[Rig]:
    group = await start_group(
        pair_launches(port_spec=0, port_base=0, name_spec=SPEC, name_base=BASE), time_scale=time_scale
    )
    telemetry = GatewayTelemetry(TelemetryConfig(process_metrics=False, known_models=("m1",)))
    try:
        spec_url, base_url = group.urls
        app = build_app(gateway_config(spec_url, base_url, **over), telemetry=telemetry)
        gw = TestServer(app)
        await gw.start_server()
        try:
            yield Rig(group, gw, app, telemetry)
        finally:
            await gw.close()
    finally:
        await telemetry.aclose()
        await group.stop()


async def until(cond: Callable[[], bool | Awaitable[bool]], within: float = 10.0, what: str = "") -> None:
    """Poll ``cond`` every 20 ms until true; fail after ``within`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        v = cond()
        if not isinstance(v, bool):
            v = await v
        if v:
            return
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {within}s: {what}")
        await asyncio.sleep(0.02)


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def events(self) -> list[bytes]:
        return [e for e in self.body.split(b"\n\n") if e.strip()]


async def post(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> Reply:
    async with session.post(url, json=body, headers=headers) as r:
        return Reply(r.status, {k.lower(): v for k, v in r.headers.items()}, await r.read())


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))
