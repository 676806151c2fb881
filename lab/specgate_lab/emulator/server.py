"""The emulated vLLM OpenAI server: one aiohttp app per engine.

Endpoints as vLLM serves them: ``POST /v1/completions``, ``POST /v1/chat/completions``,
``POST /v1/responses`` (streaming and not; :mod:`specgate_lab.emulator.responses_api`),
``POST /tokenize``, ``POST /detokenize``, ``GET /v1/models``, ``GET /health``, ``GET|POST /ping``,
``GET /version``, ``GET /metrics``. Admin (emulator only): ``GET|POST
/_emulator/faults`` (read / change fault knobs, JSON) and ``GET /_emulator/state``.

Build an engine with :func:`make_engine` (engine + metrics on a device driver), an app
with :func:`build_engine_app`, and serve it with :func:`serve_app`; ``cli_emulate``
does all three for one engine or a spec+base pair on one device.

This module wires the app; the pieces live in :mod:`specgate_lab.emulator.emulated` (the
:class:`EmulatedEngine` handle and :func:`make_engine`, re-exported here),
:mod:`specgate_lab.emulator.openai_routes` (the OpenAI endpoints),
:mod:`specgate_lab.emulator.responses` (JSON and SSE answers) and
:mod:`specgate_lab.emulator.admin_routes` (health, version, ``/metrics``, admin).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web

from specgate_lab.emulator import admin_routes, openai_routes, responses_api
from specgate_lab.emulator.emulated import ENGINE, EmulatedEngine, json_response, make_engine
from specgate_lab.emulator.errors import error_body

__all__ = ["ENGINE", "EmulatedEngine", "bound_port", "build_engine_app", "make_engine", "serve_app"]

MAX_BODY_BYTES = 32 * 1024 * 1024


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status >= 400:
            return json_response(
                error_body(e.reason, "NotFoundError" if e.status == 404 else "BadRequestError", e.status),
                e.status,
            )
        raise
    except ConnectionResetError:
        raise
    except asyncio.CancelledError:
        raise


def build_engine_app(handle: EmulatedEngine) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_errors])
    app[ENGINE] = handle
    app.router.add_get("/health", admin_routes.health)
    app.router.add_route("*", "/ping", admin_routes.health)
    app.router.add_get("/version", admin_routes.version)
    app.router.add_get("/v1/models", openai_routes.get_models)
    app.router.add_get("/metrics", admin_routes.metrics)
    app.router.add_post("/v1/completions", openai_routes.post_completions)
    app.router.add_post("/v1/chat/completions", openai_routes.post_chat)
    app.router.add_post("/v1/responses", responses_api.post_responses)
    app.router.add_get("/v1/responses/{response_id}", responses_api.get_response)
    app.router.add_post("/tokenize", openai_routes.post_tokenize)
    app.router.add_post("/detokenize", openai_routes.post_detokenize)
    app.router.add_get("/_emulator/faults", admin_routes.get_faults)
    app.router.add_post("/_emulator/faults", admin_routes.post_faults)
    app.router.add_get("/_emulator/state", admin_routes.state)
    return app


async def serve_app(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, web.TCPSite]:
    """Start ``app`` on ``host:port`` (handlers are cancelled when their client goes away)."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, site


def bound_port(runner: web.AppRunner) -> int:
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            return int(addr[1])
    raise RuntimeError("runner is not listening")
