"""Disconnect storms, slow readers and overload: bounded, nothing leaked, nothing queued."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.api.app import build_app
from tests.reliability.rig import (
    BASE,
    COPY_PROMPT,
    SPEC,
    Rig,
    chat,
    gateway_config,
    open_fds,
    post,
    rig,
    until,
)


def _emulated_busy(r: Rig) -> int:
    return sum(len(e.handle.engine.running) + len(e.handle.engine.waiting) for e in r.group.engines)


def _gateway_idle(r: Rig) -> bool:
    return r.state.inflight == 0 and all(e.inflight == 0 for e in r.state.engines)


async def test_disconnect_storm_aborts_every_upstream_request_and_leaks_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    # Emulated time at 1x: the requests would run for many seconds if not aborted.
    async with rig(time_scale=1.0) as r, aiohttp.ClientSession() as warm:
        assert (await post(warm, r.url("/v1/chat/completions"), chat(max_tokens=2))).status == 200
        assert (
            await post(warm, r.url("/v1/chat/completions"), chat(COPY_PROMPT, temperature=0.0, max_tokens=2))
        ).status == 200
        await until(lambda: _emulated_busy(r) == 0 and _gateway_idle(r), 5)
        tasks0, fds0 = len(asyncio.all_tasks()), open_fds()

        n_stream, n_unary = 30, 10
        first_chunks = 0
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as s:

            async def streamer(i: int) -> None:
                nonlocal first_chunks
                body = chat(
                    COPY_PROMPT if i % 2 else "Tell me a long story.", temperature=0.0 if i % 2 else 0.9
                )
                resp = await s.post(
                    r.url("/v1/chat/completions"), json={**body, "stream": True, "max_tokens": 3000}
                )
                assert resp.status == 200
                assert await resp.content.readany()
                first_chunks += 1
                resp.close()  # the client goes away mid-stream

            async def unary() -> None:
                await s.post(r.url("/v1/chat/completions"), json=chat(max_tokens=3000, temperature=0.9))

            await asyncio.gather(*(streamer(i) for i in range(n_stream)))
            waiting = [asyncio.create_task(unary()) for _ in range(n_unary)]
            await until(lambda: r.state.inflight == n_unary, 10, "unary requests in flight")
            await until(lambda: _emulated_busy(r) == n_unary, 10, "unary requests on the engines")
            for t in waiting:
                t.cancel()  # ... and these clients give up before any answer
            await asyncio.gather(*waiting, return_exceptions=True)
        assert first_chunks == n_stream
        # Every upstream request was aborted: the engines are idle, counts back to zero.
        await until(lambda: _emulated_busy(r) == 0, 5, "engines aborted every request")
        await until(lambda: _gateway_idle(r), 5, "gateway in-flight counts back to zero")
        await until(lambda: len(asyncio.all_tasks()) <= tasks0, 5, "no leaked tasks")
        await until(lambda: open_fds() <= fds0 + 2, 5, "no leaked sockets")
        assert not r.state.background
    # A client hanging up is normal: no error log, no traceback per disconnect.
    errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert not errors, [rec.getMessage() for rec in errors]


# -- slow readers --------------------------------------------------------------------------

EVENT_TEXT = "y" * 32_000  # no other "y" in the event or the chunked framing
N_EVENTS = 2048  # ~64 MiB of events


class FloodEngine:
    """Streams ~64 MiB as fast as the gateway takes it, counting what it managed to send."""

    def __init__(self) -> None:
        self.sent = 0
        self.done = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/health", self._ok)
        return app

    async def _ok(self, request: web.Request) -> web.Response:
        return web.Response()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse()
        resp.content_type = "text/event-stream"
        await resp.prepare(request)
        ev = {
            "id": "c",
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": EVENT_TEXT}}],
        }
        data = b"data: " + json.dumps(ev).encode() + b"\n\n"
        for _ in range(N_EVENTS):
            await resp.write(data)  # returns only when the transport drained below its limit
            self.sent += len(data)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        self.done.set()
        return resp


async def test_slow_reader_gets_backpressure_not_unbounded_buffering() -> None:
    flood = FloodEngine()
    up = TestServer(flood.app())
    await up.start_server()
    cfg = gateway_config(
        str(up.make_url("")), str(up.make_url("")), scrape={"enabled": False}, timeouts={"idle_s": 60.0}
    )
    gw = TestServer(build_app(cfg))
    await gw.start_server()
    writer: asyncio.StreamWriter | None = None
    try:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", gw.port or 0))
        reader, writer = await asyncio.open_connection(sock=sock, limit=64 * 1024)
        body = json.dumps({**chat(), "stream": True}).encode()
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        # Read nothing more: the upstream must stall once the buffers on the way are full.
        last, stalled_for = -1, 0
        while stalled_for < 3 and not flood.done.is_set():
            last = flood.sent
            await asyncio.sleep(0.2)
            stalled_for = stalled_for + 1 if flood.sent == last else 0
        total = N_EVENTS * (len(EVENT_TEXT) + 100)
        assert not flood.done.is_set(), (
            "the gateway buffered the whole stream for a reader that reads nothing"
        )
        assert flood.sent < total / 2, flood.sent
        # Then the slow reader catches up and gets every byte, in order, ending in [DONE].
        got = 0
        tail = b""
        while True:
            chunk = await reader.read(1 << 20)
            if not chunk:
                break
            got += chunk.count(b"y")
            tail = (tail + chunk)[-64:]
            if b"data: [DONE]" in tail:
                break
        assert got == N_EVENTS * len(EVENT_TEXT)
        assert flood.done.is_set()
    finally:
        if writer is not None:
            writer.close()
        await gw.close()
        await up.close()


# -- overload ---------------------------------------------------------------------------


async def test_overload_beyond_max_concurrency_is_429_with_retry_after_never_queued() -> None:
    async with (
        rig(server={"max_concurrency": 4}, timeouts={"first_byte_s": 30.0}) as r,
        aiohttp.ClientSession() as s,
    ):
        r.faults(SPEC, hang="accept")
        r.faults(BASE, hang="accept")
        held = [
            asyncio.create_task(
                post(s, r.url("/v1/chat/completions"), {**chat(max_tokens=5), "stream": i % 2 == 0})
            )
            for i in range(4)
        ]
        await until(lambda: r.state.inflight == 4, 5, "4 requests in flight")
        t0 = time.monotonic()
        extra = await asyncio.gather(
            *(post(s, r.url("/v1/chat/completions"), chat(COPY_PROMPT, max_tokens=5)) for _ in range(12))
        )
        assert time.monotonic() - t0 < 2.0  # answered at once, not queued behind the held ones
        for reply in extra:
            assert reply.status == 429
            assert reply.headers["retry-after"] == "1"
            assert reply.json()["error"]["type"] == "rate_limit_error"
        assert not any(t.done() for t in held)
        r.faults(SPEC, hang="none")
        r.faults(BASE, hang="none")
        done = await asyncio.gather(*held)
        assert [d.status for d in done] == [200] * 4
        assert _gateway_idle(r)
        # Capacity is back: the next request is served.
        assert (await post(s, r.url("/v1/chat/completions"), chat(max_tokens=5))).status == 200


async def test_a_client_reset_during_a_write_is_not_logged_as_a_server_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The race the disconnect storm hits now and then: the client's reset reaches a write
    # before the handler is cancelled. It must not surface as aiohttp's "Error handling request".
    caplog.set_level(logging.WARNING)
    app = build_app(gateway_config("http://127.0.0.1:9", "http://127.0.0.1:9", scrape={"enabled": False}))

    async def resetting(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        assert request.transport is not None
        request.transport.close()  # the client's reset, as the handler sees it
        raise aiohttp.ClientConnectionResetError("Cannot write to closing transport")

    app.router.add_get("/_reset", resetting)
    gw = TestServer(app)
    await gw.start_server()
    try:
        async with aiohttp.ClientSession() as s:
            try:
                async with s.get(gw.make_url("/_reset")) as r:
                    await r.read()
            except aiohttp.ClientError:
                pass
    finally:
        await gw.close()
    errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert not errors, [rec.getMessage() for rec in errors]


async def test_a_client_trickling_its_body_times_out_and_frees_its_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gateway.api import completions

    monkeypatch.setattr(completions, "BODY_TIMEOUT_S", 0.5)
    async with rig(server={"max_concurrency": 1}) as r, aiohttp.ClientSession() as s:
        reader, writer = await asyncio.open_connection("127.0.0.1", r.gateway.port)
        try:
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b'Content-Length: 100\r\n\r\n{"model"'
            )
            await writer.drain()
            await until(lambda: r.state.inflight == 1, 5, "slow request holds the only slot")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 408")
        finally:
            writer.close()
        assert r.state.inflight == 0
        assert (await post(s, r.url("/v1/chat/completions"), chat(max_tokens=3))).status == 200


async def test_an_engine_event_that_never_ends_is_cut_at_a_bound() -> None:
    closed = asyncio.Event()

    async def endless(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse()
        resp.content_type = "text/event-stream"
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n')
        try:
            for _ in range(10_000):  # up to ~640 MB without an event boundary
                await resp.write(b"data: " + b"z" * 65_536)
        except (ConnectionResetError, asyncio.CancelledError):
            closed.set()
            raise
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", endless)
    up = TestServer(app)
    await up.start_server()
    url = str(up.make_url("")).rstrip("/")
    gw = TestServer(build_app(gateway_config(url, url, scrape={"enabled": False})))
    await gw.start_server()
    try:
        async with aiohttp.ClientSession() as s:
            reply = await post(s, str(gw.make_url("/v1/chat/completions")), {**chat(), "stream": True})
        assert reply.status == 200
        assert reply.events[-1] == b"data: [DONE]"
        assert b"broke off" in reply.events[-2]
        assert len(reply.body) < 1 << 20  # the giant event never reached the client
        await asyncio.wait_for(closed.wait(), 10)  # and the engine's stream was closed
    finally:
        await gw.close()
        await up.close()
