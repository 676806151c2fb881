#!/usr/bin/env python3
"""A null proxy: the floor of what any Python proxy on specgate's stack costs.

An aiohttp server and an aiohttp client session on uvloop, as ``specgate serve`` relays, that
forwards every chat request to one fixed upstream and relays its answer (one body, or the
stream chunk by chunk): no JSON, no features, no policy, no telemetry, no slots. Set beside
specgate's proxy in ``bench_overhead.py`` (target ``null-proxy``), the difference between the
two is what specgate's decision path costs the proxy, as ``null_epp.py`` shows it for the
Endpoint Picker; the two null targets side by side compare the paths' floors.

    python loadtests/null_proxy.py --upstream 127.0.0.1:8000 --port-file FILE

Not a product component: a benchmark reference only.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import aiohttp
from aiohttp import web


def forwarder(upstream: str, session: aiohttp.ClientSession) -> web.Application:
    """POST /v1/chat/completions relayed to ``upstream`` (``ip:port``); GET /health answered."""
    url = f"http://{upstream}/v1/chat/completions"

    async def forward(request: web.Request) -> web.StreamResponse:
        data = await request.read()
        async with session.post(url, data=data, headers={"Content-Type": "application/json"}) as r:
            if r.headers.get("Content-Type", "").startswith("text/event-stream"):
                out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await out.prepare(request)
                async for piece in r.content.iter_any():
                    await out.write(piece)
                await out.write_eof()
                return out
            return web.Response(body=await r.read(), content_type="application/json")

    async def health(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", forward)
    app.router.add_get("/health", health)
    return app


async def serve(upstream: str, port_file: str, listening: asyncio.Event | None = None) -> None:
    """Serve until cancelled; the port goes to ``port_file``, then ``listening`` is set."""
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0),
        timeout=aiohttp.ClientTimeout(total=None),
    ) as session:
        runner = web.AppRunner(forwarder(upstream, session), access_log=None, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        try:
            Path(port_file).write_text(str(runner.addresses[0][1]))  # noqa: ASYNC240 - once
            if listening is not None:
                listening.set()
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--upstream", required=True, help="ip:port every request is forwarded to")
    ap.add_argument("--port-file", required=True, help="where to write the port listened on")
    args = ap.parse_args()
    import uvloop

    uvloop.run(serve(args.upstream, args.port_file))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
