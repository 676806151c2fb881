"""One emulated engine as the server sees it: engine, metrics, faults, device driver.

:func:`make_engine` builds an :class:`EmulatedEngine` (engine + metrics on a device
driver); the server's handlers find it under the :data:`ENGINE` app key and answer with
:func:`json_response`; :func:`cut_connection` drops a client like a dead process does.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from specgate_lab.emulator.device import DeviceDriver
from specgate_lab.emulator.engine import Engine, EngineConfig
from specgate_lab.emulator.faults import Faults
from specgate_lab.emulator.metrics import EngineMetrics
from specgate_lab.emulator.thinking import ANSWERS


@dataclass(eq=False)
class EmulatedEngine:
    """An engine, its metrics and faults, stepping on a (possibly shared) device driver."""

    engine: Engine
    driver: DeviceDriver
    metrics: EngineMetrics
    faults: Faults = field(default_factory=Faults)
    per_request_metrics: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    requests_seen: int = 0
    dead: bool = False
    #: called once when the engine crashes (e.g. closes its listening socket)
    on_crash: Callable[[], Awaitable[None]] | None = None
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    _open: dict[int, web.Request] = field(default_factory=dict)
    _hang_release: asyncio.Event | None = None

    @property
    def name(self) -> str:
        return self.engine.config.served_model_name

    def hang_event(self) -> asyncio.Event:
        if self._hang_release is None:
            self._hang_release = asyncio.Event()
        return self._hang_release

    def set_faults(self, update: dict[str, Any]) -> None:
        merged = self.faults.model_dump() | update
        self.faults = Faults.model_validate(merged)
        if self.faults.hang == "none" and self._hang_release is not None:
            self._hang_release.set()  # release requests held by a hang
            self._hang_release = None

    async def crash(self) -> None:
        """Die like a killed process: every request is lost and every connection cut."""
        if self.dead:
            return
        self.dead = True
        for req in list(self.engine.running) + list(self.engine.waiting):
            self.engine.abort(req, self.driver.now())
        for r in list(self._open.values()):
            cut_connection(r)
        if self.on_crash is not None:
            await self.on_crash()


def make_engine(
    config: EngineConfig,
    driver: DeviceDriver,
    *,
    log_stats: bool = True,
    per_request_metrics: bool = False,
    faults: Faults | None = None,
) -> EmulatedEngine:
    metrics = EngineMetrics(
        config.served_model_name,
        spec_k=config.spec.k if config.spec else None,
        max_model_len=config.max_model_len,
        log_stats=log_stats,
        num_gpu_blocks=config.num_gpu_blocks,
    )
    engine = Engine(config, observer=metrics)
    engine.memory = ANSWERS  # the model's answers, as every engine of this process gives them
    metrics.engine = engine
    driver.device.attach(engine)
    return EmulatedEngine(
        engine, driver, metrics, faults or Faults(), per_request_metrics, rng=random.Random(config.seed)
    )


ENGINE = web.AppKey("engine", EmulatedEngine)


def cut_connection(request: web.Request) -> None:
    tr = request.transport
    if tr is not None:
        tr.abort()


def json_response(obj: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(obj, separators=(",", ":")).encode(), status=status, content_type="application/json"
    )
