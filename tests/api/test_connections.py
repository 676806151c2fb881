"""Connections that send nothing, or trickle their headers, are closed after
``server.header_timeout_s``; beyond ``server.max_connections`` a connection gets 503; fds
return to where they were; real requests are unaffected."""

from __future__ import annotations

import asyncio
import json
import os
import re

import aiohttp

from gateway.api.app import build_app
from gateway.api.server import GatewayRunner
from tests.api.gwserver import served
from tests.proxy.harness import gateway_config
from tests.reliability.rig import until

DEAD = "http://127.0.0.1:9"
HEADER_TIMEOUT = 0.5


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


async def _closed_by_server(reader: asyncio.StreamReader) -> bool:
    """Read until EOF (or a reset): the server closed the connection."""
    try:
        while await reader.read(65536):
            pass
    except ConnectionError:
        pass
    return True


async def _trickle(writer: asyncio.StreamWriter, head: bytes) -> None:
    """Send ``head`` then one header byte per 50 ms, for ever (until the server closes)."""
    writer.write(head)
    try:
        while True:
            await asyncio.sleep(0.05)
            writer.write(b"X")
            await writer.drain()
    except (ConnectionError, RuntimeError):
        return


async def test_idle_and_trickling_connections_are_closed_and_fds_return() -> None:
    cfg = gateway_config(DEAD, DEAD, server={"header_timeout_s": HEADER_TIMEOUT, "keepalive_timeout_s": 30})
    async with served(build_app(cfg)) as (runner, port), aiohttp.ClientSession() as s:
        baseline = _fds()
        loop = asyncio.get_running_loop()
        started = loop.time()
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(30)]
        trickling = [await asyncio.open_connection("127.0.0.1", port) for _ in range(30)]
        tricklers = [
            asyncio.create_task(_trickle(w, b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nX-Slow: "))
            for _, w in trickling
        ]
        # A kept-alive connection whose second request trickles is held to the same deadline.
        kr, kw = await asyncio.open_connection("127.0.0.1", port)
        kw.write(b"GET /health HTTP/1.1\r\nHost: gw\r\n\r\n")
        assert (await kr.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        await kr.readexactly(len(b'{"status": "ok"}'))
        tricklers.append(asyncio.create_task(_trickle(kw, b"GET /health HTTP/1.1\r\nX-Slow: ")))
        # Real requests meanwhile are unaffected.
        for _ in range(5):
            async with s.get(f"http://127.0.0.1:{port}/health") as r:
                assert r.status == 200
        everyone = [r for r, _ in idle + trickling] + [kr]
        await asyncio.wait_for(asyncio.gather(*(_closed_by_server(r) for r in everyone)), 20)
        assert loop.time() - started >= HEADER_TIMEOUT  # closed by the deadline, not before
        await asyncio.wait_for(asyncio.gather(*tricklers), 5)
        for _, w in [*idle, *trickling, (kr, kw)]:
            w.close()
        await until(
            lambda: len(runner.server.connections if runner.server else []) <= 1, 10, "server side closed"
        )
        await s.close()
        await until(lambda: _fds() <= baseline, 10, f"fds back to {baseline} (now {_fds()})")
        # And the gateway still serves.
        async with aiohttp.ClientSession() as s2, s2.get(f"http://127.0.0.1:{port}/health") as r:
            assert r.status == 200


async def test_connections_beyond_the_cap_get_an_openai_shaped_503() -> None:
    cfg = gateway_config(DEAD, DEAD, server={"max_connections": 4, "header_timeout_s": 60})
    async with served(build_app(cfg)) as (runner, port):
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(4)]
        server = runner.server
        assert server is not None
        await until(lambda: len(server.connections) == 4, 10, "4 connections accepted")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        raw = await asyncio.wait_for(reader.read(-1), 10)
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503") and b"Connection: close" in head
        assert re.search(rb"\r\nx-request-id: [0-9a-f]{32}\r\n", head), head
        assert json.loads(body)["error"]["code"] == "too_many_connections"
        writer.close()
        for _, w in held[:1]:
            w.close()
        await until(lambda: len(server.connections) == 3, 10, "a slot freed")
        async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/health") as r:
            assert r.status == 200
        for _, w in held[1:]:
            w.close()


def test_runner_takes_its_limits_from_the_config() -> None:
    cfg = gateway_config(
        DEAD, DEAD, server={"header_timeout_s": 3, "max_connections": 7, "keepalive_timeout_s": 9}
    )
    runner = GatewayRunner(build_app(cfg))
    assert runner._limits.header_timeout_s == 3 and runner._limits.max_connections == 7
    assert runner._kwargs["keepalive_timeout"] == 9
