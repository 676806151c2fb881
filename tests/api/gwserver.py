"""The gateway app served as ``specgate serve`` serves it (``GatewayRunner``), on an ephemeral port."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from gateway.api.app import RUNNER_KWARGS
from gateway.api.server import GatewayRunner


@asynccontextmanager
async def served(app: web.Application) -> AsyncIterator[tuple[GatewayRunner, int]]:
    runner = GatewayRunner(app, shutdown_timeout=1.0, **RUNNER_KWARGS)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
        yield runner, port
    finally:
        await runner.cleanup()
