"""Build the gateway's aiohttp application.

``build_app(config)`` returns an :class:`aiohttp.web.Application` whose startup opens
one pooled keep-alive session per engine and (when ``scrape.enabled``) starts a
``/metrics`` scraper and an active health checker per engine; cleanup stops them.
Run it with ``handler_cancellation=True`` (as ``specgate serve`` and aiohttp's
``TestServer`` do) so that a client disconnect cancels the handler at once and the
upstream request is closed while the engine is still working.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from gateway.advisor.metrics import AdviceCollector
from gateway.api import admin, routes, tokens
from gateway.api.completions import chat_completions, completions, responses
from gateway.api.fleet import PairWorkers, apply_config
from gateway.api.state import STATE, GatewayState, rid_of
from gateway.config.models import GatewayConfig
from gateway.engines.runtime import ModelRuntime
from gateway.fleet.dns import Resolver
from gateway.fleet.registry import FleetRegistry, PairsChanged
from gateway.fleet.reload import ConfigSource, Reloader
from gateway.fleet.sources import Discovery
from gateway.peers.bus import PeerBus
from gateway.peers.metrics import PeerCollector
from gateway.peers.service import PeerService
from gateway.placement import FleetPolicy
from gateway.routing.adaptive import AdaptivePolicy
from gateway.routing.factory import build_policy
from gateway.routing.types import Policy, Route
from gateway.telemetry.hooks import NullTelemetry, Telemetry
from gateway.telemetry.wiring import attach_models, forget_engines
from gateway.wire.errors import ApiError, error_response
from gateway.wire.headers import REQUEST_ID

log = logging.getLogger(__name__)

# Keyword arguments for web.AppRunner / web.run_app that the gateway relies on.
RUNNER_KWARGS: dict[str, Any] = {"handler_cancellation": True, "access_log": None}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
WORKERS: web.AppKey[PairWorkers] = web.AppKey("specgate_pair_workers", PairWorkers)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error leaves in OpenAI's shape, with an x-request-id; never a traceback."""
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc, {REQUEST_ID: rid_of(request)})
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if exc.status == 404:
            msg = f"no such endpoint: {request.method} {request.path[:200]}"
        elif exc.status == 405:
            msg = f"method {request.method} not allowed on {request.path[:200]}"
        else:
            msg = exc.reason
        err = ApiError(exc.status, msg, code=exc.reason.lower().replace(" ", "_"))
        return error_response(err, {REQUEST_ID: rid_of(request)})
    except asyncio.CancelledError:
        raise
    except ConnectionResetError:
        # The client went away mid-response: nothing can be sent and nothing is wrong with
        # the gateway. Re-raising would make aiohttp log a traceback per disconnect.
        return web.Response(status=499)
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        err = ApiError(500, "internal gateway error", code="internal_error")
        return error_response(err, {REQUEST_ID: rid_of(request)})


async def _with_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """Every response carries ``x-request-id``, whichever route or middleware produced it
    (set as its headers are sent, so streams and errors alike)."""
    if REQUEST_ID not in response.headers:
        response.headers[REQUEST_ID] = rid_of(request)


def build_app(
    config: GatewayConfig,
    *,
    telemetry: Telemetry | None = None,
    policies: Mapping[str, Policy] | None = None,
    peer_bus: PeerBus | None = None,
    config_source: ConfigSource | None = None,
    resolver: Resolver | None = None,
) -> web.Application:
    """The gateway application for ``config``. ``policies`` overrides a model's policy by name;
    ``peer_bus`` joins the replicas through that bus instead of ``peers.url``'s Redis;
    ``config_source`` re-reads the configuration for a reload (SIGHUP, ``POST /admin/reload``,
    ``fleet.watch_config_s``; without it the gateway cannot reload); ``resolver`` replaces
    the DNS discovery's ``getaddrinfo`` (tests)."""
    models: dict[str, ModelRuntime] = {}
    for m in config.models:
        policy = (policies or {}).get(m.name) or build_policy(m.routing)
        if isinstance(policy, AdaptivePolicy):  # a regime per pair once the model has several
            policy = FleetPolicy(policy)
        models[m.name] = ModelRuntime.from_config(m, policy, stale_after_s=config.scrape.stale_after_s)
    state = GatewayState(config=config, models=models, telemetry=telemetry or NullTelemetry())
    attach_models(state.telemetry, models)  # live routing state for /metrics, read at scrape time
    state.peers = _peer_service(config, state, peer_bus)
    registry = getattr(state.telemetry, "registry", None)
    if state.peers is not None and registry is not None:
        registry.register(PeerCollector(state.peers))
    if registry is not None:
        profiles = {m.name: m.routing.profile for m in config.models}
        registry.register(AdviceCollector(lambda: state.advice, profiles))

    app = web.Application(
        client_max_size=config.server.max_body_bytes,
        middlewares=[_errors],
        # Bodies are decoded by the gateway, bounded and off the event loop (api/body.py):
        # aiohttp's own decoding runs on the loop, and decodes an unread rest on close.
        handler_args={"auto_decompress": False},
    )
    app[STATE] = state
    app[WORKERS] = workers = PairWorkers(state)
    state.fleet = FleetRegistry(state.models, config.fleet, workers)
    state.fleet.listeners.append(functools.partial(_forget_pairs, models, state.telemetry))
    state.discovery = Discovery(state.fleet, resolver=resolver)
    for m in config.models:
        state.discovery.update(m.name, m.discovery)
    if config_source is not None:
        state.reloader = Reloader(config_source, lambda: state.config, lambda new: apply_config(state, new))
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/responses", responses)
    app.router.add_post("/tokenize", tokens.tokenize)
    app.router.add_post("/detokenize", tokens.detokenize)
    app.router.add_get("/v1/models", routes.list_models)
    app.router.add_get("/v1/models/{model}", routes.get_model)
    app.router.add_get("/health", routes.health)
    app.router.add_get("/ready", routes.ready)
    app.router.add_get("/metrics", routes.metrics)
    app.router.add_get("/admin/state", admin.state)
    app.router.add_get("/admin/advice", admin.advice)
    app.router.add_post("/admin/route", admin.set_route)
    app.router.add_post("/admin/drain", admin.drain)
    app.router.add_post("/admin/reload", admin.reload)
    app.on_response_prepare.append(_with_request_id)
    app.on_startup.append(_startup)
    app.on_cleanup.append(_cleanup)
    if config.epp.enabled:  # the Endpoint Picker for Envoy, on its own port
        from gateway.api.epp.server import attach

        attach(app)
    return app


def _forget_pairs(models: Mapping[str, ModelRuntime], telemetry: object, change: PairsChanged) -> None:
    """A pair gone from a model takes its placement state and its engines' series with it."""
    mrt = models.get(change.model)
    if mrt is not None and isinstance(mrt.policy, FleetPolicy):
        for pair in change.gone:
            mrt.policy.forget(pair.base.name)
    if change.gone:
        forget_engines(telemetry, (e.name for pair in change.gone for e in pair.engines))


def _peer_service(config: GatewayConfig, state: GatewayState, bus: PeerBus | None) -> PeerService | None:
    """The peer channel (gateway.peers) when configured: off by default."""
    url = config.peers.url
    if bus is None and url is None:
        return None
    if bus is None:
        from gateway.peers.redis_bus import RedisBus

        bus = RedisBus(
            url.get_secret_value() if url else "", config.peers.channel, timeout_s=config.peers.timeout_s
        )

    def move(model: str, route: Route) -> None:
        board = state.moves.get(model)
        asked = board.move(route).moving if board is not None else 0
        log.info("regime flip (peer channel): %d stream(s) asked to leave the %s engine", asked, route.value)

    return PeerService(config.peers, bus, state.models, on_move=move)


async def _startup(app: web.Application) -> None:
    state = app[STATE]
    state.started_at = time.time()
    state.pool.open(state.engines)
    workers = app[WORKERS]
    for m in state.models.values():
        for p in m.pairs:
            workers.start(m, p, joined=False)
    if state.peers is not None:
        await state.peers.start()
    if state.discovery is not None:
        state.discovery.start()
    if state.reloader is not None:
        await state.reloader.start()


async def _cleanup(app: web.Application) -> None:
    state = app[STATE]
    if state.reloader is not None:
        await state.reloader.stop()
    if state.discovery is not None:
        await state.discovery.stop()
    if state.fleet is not None:
        await state.fleet.close()
    if state.peers is not None:
        await state.peers.stop()
    await app[WORKERS].stop_all()
    pending = list(state.background)
    if pending:
        _, still = await asyncio.wait(pending, timeout=2.0)
        for t in still:
            t.cancel()
        if still:
            await asyncio.wait(still, timeout=1.0)
    await state.pool.close()
