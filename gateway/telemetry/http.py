"""Mount the Prometheus endpoint on the gateway's aiohttp app."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable

from aiohttp import web

from gateway.telemetry.service import GatewayTelemetry

# The classic text format generate_latest() writes (Prometheus 2.x and later parse it).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

TELEMETRY_KEY: web.AppKey[GatewayTelemetry] = web.AppKey("specgate_telemetry", GatewayTelemetry)


def _unauthorized() -> web.Response:
    return web.json_response(
        {
            "error": {
                "message": "metrics require 'Authorization: Bearer <metrics key>'",
                "type": "authentication_error",
                "param": None,
                "code": "invalid_api_key",
            }
        },
        status=401,
        headers={"WWW-Authenticate": 'Bearer realm="metrics"'},
    )


def metrics_handler(
    telemetry: GatewayTelemetry, key: str | None = None
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    expected = f"Bearer {key}".encode() if key else None

    async def handle(request: web.Request) -> web.StreamResponse:
        if expected is not None:
            got = request.headers.get("Authorization", "").encode("utf-8", "replace")
            if not hmac.compare_digest(got, expected):
                return _unauthorized()
        body = telemetry.exposition()
        resp = web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            resp.enable_compression()
        return resp

    return handle


def mount_metrics(
    app: web.Application, telemetry: GatewayTelemetry, *, path: str | None = None, key: str | None = None
) -> None:
    """Add ``GET <path>`` (default: the config's ``metrics_path``) serving ``telemetry``'s registry.

    ``key`` (default: the config's ``metrics_key``) makes the endpoint require a bearer token.
    The telemetry object is stored under :data:`TELEMETRY_KEY`; its trace exporters are
    flushed on app cleanup.
    """
    cfg = telemetry.config
    app[TELEMETRY_KEY] = telemetry

    async def _close(_: web.Application) -> None:
        await telemetry.aclose()

    app.on_cleanup.append(_close)
    if not cfg.metrics:
        return
    if key is None and cfg.metrics_key is not None:
        key = cfg.metrics_key.get_secret_value()
    app.router.add_get(path or cfg.metrics_path, metrics_handler(telemetry, key), allow_head=False)
