"""Typed application state (``web.AppKey``) shared by the handlers."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from pydantic import SecretStr

from gateway.advisor.report import Advice
from gateway.api.learning import SampleBudget, advice_settings
from gateway.config.models import GatewayConfig
from gateway.engines.runtime import EngineRuntime, ModelRuntime
from gateway.fleet.registry import FleetRegistry
from gateway.fleet.reload import Reloader
from gateway.fleet.sources import Discovery
from gateway.peers.service import PeerService
from gateway.proxy.move import MoveBoard
from gateway.proxy.pool import UpstreamPool
from gateway.proxy.stream import SHUTDOWN
from gateway.telemetry.hooks import Telemetry
from gateway.text.suffix import SuffixSettings
from gateway.wire.headers import REQUEST_ID, request_id

RID: web.RequestKey[str] = web.RequestKey("specgate_request_id", str)


def rid_of(request: web.Request) -> str:
    """This request's id, chosen once: the client's ``x-request-id`` when it is safe, else a
    new one. Every response carries it (:func:`gateway.api.app` sets the header on prepare)."""
    rid = request.get(RID)
    if rid is None:
        rid = request[RID] = request_id(request.headers.get(REQUEST_ID))
    return rid


@dataclass
class GatewayState:
    config: GatewayConfig
    models: dict[str, ModelRuntime]
    telemetry: Telemetry
    pool: UpstreamPool = field(default_factory=UpstreamPool)
    inflight: int = 0
    started_at: float = 0.0
    background: set[asyncio.Task[Any]] = field(default_factory=set)
    fleet: FleetRegistry | None = None  # the models' live pairs (gateway.fleet)
    discovery: Discovery | None = None  # the discovery sources feeding it
    reloader: Reloader | None = None  # re-reads the configuration (None: started without a source)
    ready_cache: tuple[float, bool, dict[str, object]] | None = None
    cards_cache: tuple[float, dict[str, dict[str, Any]]] | None = None  # /v1/models: engine fields
    budgets: dict[str, SampleBudget] = field(default_factory=dict)
    draining: bool = False  # set on SIGTERM: /ready is 503 and new requests are refused
    streams: set[asyncio.Task[Any]] = field(default_factory=set)  # handlers relaying a stream
    # per model: the streams that could move to their sibling at a regime flip
    moves: dict[str, MoveBoard] = field(default_factory=dict)
    peers: PeerService | None = None  # the channel to the other gateway replicas (optional)
    # per model: what the sampled answers' n-gram replays say speculation would buy
    advice: dict[str, Advice] = field(default_factory=dict)

    _idle: asyncio.Event | None = None

    async def drain(self, grace_s: float) -> bool:
        """Refuse new requests and wait up to ``grace_s`` for those in flight; True if all finished."""
        self.draining = True
        if self.inflight > 0:
            self._idle = asyncio.Event()
            try:
                await asyncio.wait_for(self._idle.wait(), grace_s)
            except TimeoutError:
                pass
        return self.inflight == 0

    def cut_streams(self) -> int:
        """Grace period over: end the streams still relaying (each sends an error event and
        ``[DONE]`` before closing). Returns how many were cut."""
        tasks = [t for t in self.streams if not t.done()]
        for t in tasks:
            t.cancel(SHUTDOWN)
        return len(tasks)

    def request_done(self) -> None:
        """Called by the request path each time a request in flight ends."""
        self.inflight -= 1
        if self.inflight <= 0 and self._idle is not None:
            self._idle.set()

    @property
    def tenant_keys(self) -> bool:
        """Some model has keys of its own (model names are then not disclosed in errors)."""
        return any(m.config.api_keys for m in self.models.values())

    @property
    def open_models(self) -> bool:
        """Some model may be used without a key (no server keys, no keys of its own)."""
        return not self.config.server.api_keys and any(not m.config.api_keys for m in self.models.values())

    @property
    def forward_headers(self) -> frozenset[str]:
        """Client headers forwarded to engines beyond the built-in allow-list."""
        return frozenset(self.config.server.forward_headers)

    @property
    def client_keys(self) -> list[SecretStr]:
        """Every client key: the server's (all models) and each model's own."""
        keys = list(self.config.server.api_keys)
        for m in self.models.values():
            keys.extend(m.config.api_keys)
        return keys

    def advice_for(self, model: str) -> Advice:
        """The model's advice (:func:`~gateway.api.learning.advice_settings`)."""
        a = self.advice.get(model)
        if a is None:
            cfg = self.models[model].config
            cached = cfg.advice.suffix_cached_answers
            suffix = SuffixSettings(max_cached_requests=cached) if cached else None
            a = self.advice[model] = Advice(advice_settings(cfg), suffix)
        return a

    def lookup_budget(self, model: str) -> SampleBudget:
        b = self.budgets.get(model)
        if b is None:
            b = self.budgets[model] = SampleBudget()
        return b

    @property
    def engines(self) -> list[EngineRuntime]:
        return [e for m in self.models.values() for e in m.engines.values()]

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` in the background, keeping a reference until it finishes."""
        task = asyncio.get_running_loop().create_task(coro)
        self.background.add(task)
        task.add_done_callback(self.background.discard)


STATE: web.AppKey[GatewayState] = web.AppKey("specgate_state", GatewayState)
