"""Relay a server-sent event stream from an engine to the client, event by event.

Events are relayed as they arrive (never buffered beyond what one read returned), the
``model`` field is rewritten back to the client's name, the usage chunk the gateway asked
for on the client's behalf is dropped, and a stream that breaks after bytes reached the
client ends with ``data: {"error": ...}`` and ``data: [DONE]``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import aiohttp
from aiohttp import web

from gateway.engines.runtime import EngineRuntime
from gateway.pipeline.request import RESPONSES
from gateway.proxy.handoff import MoveRelay, Side, release
from gateway.proxy.idle import IdleTimer
from gateway.proxy.move import OPENING, Continuation
from gateway.proxy.result import ProxyResult
from gateway.proxy.sse import (
    CONTENT,
    DONE,
    REASONING,
    Harvest,
    Patterns,
    error_event,
    responses_event,
    rewrite_model,
    slow_event,
    token_kind,
)
from gateway.telemetry.logthrottle import LogThrottle
from gateway.wire.errors import engine_error
from gateway.wire.headers import downstream_headers

log = logging.getLogger(__name__)
_THROTTLE = LogThrottle(5.0)  # one stalled-client warning per 5 s

MAX_SSE_EVENT = 4 * 1024 * 1024  # one server-sent event larger than this breaks the stream


# Cancel message of a relaying handler cut at shutdown (``task.cancel(SHUTDOWN)``): the
# relay then sends the client an error event and ``[DONE]`` before closing.
SHUTDOWN = "specgate: shutdown grace period over"


class StreamRelay(MoveRelay):
    """Mixin of :class:`gateway.proxy.forward.ProxyCall`: the streaming half of an attempt."""

    __slots__ = ()

    endpoint: str
    client_model: str
    # Where a relaying task registers itself while it streams (so that shutdown can cut
    # it with :data:`SHUTDOWN`); None: nobody cuts streams.
    streams: set[asyncio.Task[Any]] | None

    async def _relay_stream(
        self,
        rt: EngineRuntime,
        resp: aiohttp.ClientResponse,
        first_deadline: float,
        deadline: float,
        result: ProxyResult,
    ) -> None:
        content = resp.content
        # Wait for the first bytes before answering the client: until then a failure
        # can still move the request to the sibling engine.
        with self._upstream_read(
            rt,
            result,
            timeout_error="first_byte_timeout",
            timeout_message=f"engine {rt.name} sent no event in time",
            what="stream",
            total=first_deadline >= deadline,
        ):
            chunk = content.read_nowait()  # events that came with the headers: no timer needed
            if not chunk and not content.at_eof():
                async with asyncio.timeout_at(first_deadline):
                    chunk = await content.readany()
        if not chunk:
            raise self._fail(rt, "disconnected", 502, f"engine {rt.name} closed the stream", result.reason)
        if self.hold.ticket is not None:  # the first byte: no longer a queued request to send elsewhere
            self.hold.ticket.waiting = None

        out = web.StreamResponse(status=200, headers=self._client_headers(rt, result.reason))
        out.headers.update(downstream_headers(resp.headers))
        out.content_type = "text/event-stream"
        out.headers["Cache-Control"] = "no-cache"
        out.headers["X-Accel-Buffering"] = "no"
        result.response = out
        result.status = 200
        await out.prepare(self.request)
        streams = self.streams
        task = asyncio.current_task()
        if streams is not None and task is not None:
            streams.add(task)
        try:
            await self._relay_events(rt, resp, chunk, out, deadline, result)
        except asyncio.CancelledError as exc:
            if SHUTDOWN in exc.args:
                await _last_words(out, "the gateway is shutting down; the stream was cut")
            raise
        finally:
            if streams is not None and task is not None:
                streams.discard(task)

    async def _relay_events(
        self,
        rt: EngineRuntime,
        resp: aiohttp.ClientResponse,
        chunk: bytes,
        out: web.StreamResponse,
        deadline: float,
        result: ProxyResult,
    ) -> None:
        side = Side(rt, resp)
        try:
            await self._pump(side, chunk, out, deadline, result)
        finally:
            if side.rt is not rt:  # moved: the sibling's response is the relay's own to close
                release(side.resp, side.rt)
                side.rt.inflight -= 1
                rt.inflight += 1  # the attempt's own count (rt.track) ends with the attempt

    async def _pump(
        self, side: Side, chunk: bytes, out: web.StreamResponse, deadline: float, result: ProxyResult
    ) -> None:
        loop = asyncio.get_running_loop()
        t = self.model.timeouts
        rt, content = side.rt, side.resp.content
        patterns = self._patterns(rt)
        harvest = result.harvest
        swallow_usage = not self.include_usage
        buf = b""
        saw_done = False
        broken: str | None = None
        idle = IdleTimer(loop, t.idle_s, deadline)
        ticket = self._enlist(rt)
        cont: Continuation | None = None
        try:
            async with asyncio.timeout(None) as tm:
                while True:
                    buf += chunk
                    parts = buf.split(b"\n\n")
                    buf = parts.pop()
                    if len(buf) > MAX_SSE_EVENT:  # an engine that never ends its event: bounded memory
                        broken = "oversized_event"
                        break
                    if parts:
                        pieces: list[bytes] = []
                        for ev in parts:
                            piece, done = self._event(
                                ev, patterns, harvest, swallow_usage, result, loop, cont
                            )
                            if piece:
                                pieces.append(piece)
                            saw_done = saw_done or done
                        if pieces:
                            data = b"".join(pieces)
                            # The write waits only when the client's buffer is full: then it is
                            # the client that is slow, timed by its own limit, never the engine's.
                            idle.client(tm, t.client_stall_s)
                            await out.write(data)
                            if ticket is not None and not ticket.keep(data):
                                self._withdraw(ticket)
                                ticket = None
                    if saw_done:
                        break
                    if ticket is not None and ticket.wanted and ticket.phase != OPENING:
                        idle.touch(tm)  # the sibling's answer is bounded by its own budget
                        cont = await self._move(side, ticket, deadline)
                        self._withdraw(ticket)  # a stream moves at most once
                        ticket = None
                        if cont is not None:
                            result.moved, result.engine, result.route = True, side.rt.name, side.rt.route
                            rt, content, chunk = side.rt, side.resp.content, side.first
                            patterns, buf = self._patterns(rt), b""
                            continue
                    idle.touch(tm)  # a float store per chunk, not a timer
                    chunk = await content.readany()
                    if not chunk:
                        break
        except TimeoutError:
            if idle.waiting_client:
                self._client_stalled(rt, result)
                return
            broken = "total_timeout" if loop.time() >= deadline else "idle_timeout"
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            if isinstance(exc, aiohttp.ClientConnectionResetError):
                raise  # the client went away (raised by our write)
            broken = "disconnected"
        finally:
            idle.close()
            if ticket is not None:
                self._withdraw(ticket)
        await self._finish_stream(rt, content, buf, out, broken, saw_done, patterns, cont, result, loop)

    async def _finish_stream(
        self,
        rt: EngineRuntime,
        content: aiohttp.StreamReader,
        buf: bytes,
        out: web.StreamResponse,
        broken: str | None,
        saw_done: bool,
        patterns: Patterns,
        cont: Continuation | None,
        result: ProxyResult,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """The end of a stream: its last event, the error event of a break, ``[DONE]``."""
        harvest = result.harvest
        swallow_usage = not self.include_usage
        if broken is None and not saw_done:
            if buf.strip():
                piece, saw_done = self._event(buf, patterns, harvest, swallow_usage, result, loop, cont)
                if piece:
                    await out.write(piece)
            if not saw_done and harvest.error is None:
                broken = "truncated"
        if broken is not None:
            rt.record_failure(broken)
            result.error = broken
            try:
                self.telemetry.upstream_failed(rt.name, broken, False)
            except Exception:
                log.exception("telemetry upstream_failed failed")
            msg = {
                "idle_timeout": f"engine {rt.name} stalled mid-stream",
                "total_timeout": "request exceeded its total time limit",
            }.get(broken, f"engine {rt.name} broke off the stream")
            await out.write(error_event(msg, 504 if "timeout" in broken else 502) + DONE)
        elif not saw_done:
            await out.write(DONE)  # the engine sent an error event and stopped
        await out.write_eof()
        if saw_done:
            await _drain(content)
        result.ok = broken is None and harvest.error is None
        if harvest.error is not None and result.error is None:
            result.error = harvest.error

    def _client_stalled(self, rt: EngineRuntime, result: ProxyResult) -> None:
        """The client stopped reading: cut its connection (nothing more can reach it) and
        let the caller close the engine response, which aborts the engine request. The
        engine did nothing wrong: no failure is recorded against it."""
        result.error = "client_stalled"
        result.ok = False
        transport = self.request.transport
        if transport is not None:
            transport.abort()
        _THROTTLE.log(
            log,
            logging.WARNING,
            "client_stalled",
            "a client stopped reading its stream for %.0f s: disconnected (engine %s not blamed)",
            self.model.timeouts.client_stall_s,
            rt.name,
        )

    def _token_seen(self, result: ProxyResult, kind: int) -> None:
        """A token reached the client: the first of any kind (reasoning, content or a tool
        call) is the answer's TTFT, the first content its time to first content."""
        now = time.monotonic()
        if result.first_token_at is None:
            result.first_token_at = now
            try:
                self.telemetry.first_token()
            except Exception:
                log.exception("telemetry first_token failed")
        if kind == CONTENT and result.first_content_at is None:
            result.first_content_at = now
            try:
                self.telemetry.first_content()
            except Exception:
                log.exception("telemetry first_content failed")
        result.last_token_at = now

    def _event(
        self,
        ev: bytes,
        patterns: Patterns,
        harvest: Harvest,
        swallow_usage: bool,
        result: ProxyResult,
        loop: asyncio.AbstractEventLoop,
        cont: Continuation | None = None,
    ) -> tuple[bytes, bool]:
        """One SSE event → (bytes to send, saw [DONE]); ``cont``: the event comes from the
        sibling that continues a moved answer, and is rewritten into the client's."""
        if self.endpoint == RESPONSES:  # typed events, never moved
            piece, done, token = responses_event(ev, self.client_model, harvest)
            if token:
                self._token_seen(result, CONTENT)
            return piece, done
        if ev.startswith(b"data:"):
            data = ev[5:].strip()
            if data == b"[DONE]":
                return DONE, True
            if cont is None and not harvest.collect_text and not slow_event(data):
                # Fast path for the plain content chunks that make up almost all of a stream:
                # rename the model in place and note whether it carried content, no JSON round trip.
                for old, new in patterns:
                    if old in data:
                        if kind := token_kind(data):
                            harvest.content_events += 1
                            harvest.reasoning_events += kind == REASONING
                            self._token_seen(result, kind)
                        return b"data: " + data.replace(old, new, 1) + b"\n\n", False
            try:
                obj = json.loads(data)
            except ValueError:
                return ev + b"\n\n", False
            if not isinstance(obj, dict):
                return ev + b"\n\n", False
            if cont is not None:
                if not cont.apply(obj):
                    return b"", False
                if "model" in obj:
                    obj["model"] = self.client_model
            if kind := harvest.take(obj):
                self._token_seen(result, kind)
            if harvest.error is not None and (err := engine_error(obj, None)) is not None:
                return b"data: " + json.dumps(err).encode() + b"\n\n", False  # the gateway's shape
            if swallow_usage and obj.get("choices") == [] and "usage" in obj:
                return b"", False
            if cont is not None:  # rewritten in place: serialised anew, once
                out = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
            else:
                out = rewrite_model(data, patterns, obj, self.client_model)
            return b"data: " + out + b"\n\n", False
        return ev + b"\n\n", False


async def _last_words(out: web.StreamResponse, message: str) -> None:
    """Best effort, bounded: an error event and [DONE] to a client whose stream is being cut."""
    try:
        async with asyncio.timeout(1.0):
            await out.write(error_event(message, 503, "service_unavailable") + DONE)
            await out.write_eof()
    except (TimeoutError, ConnectionError, RuntimeError):
        pass


async def _drain(content: aiohttp.StreamReader) -> None:
    """Read the end of a finished stream (the chunked terminator) so the connection is reused."""
    if content.is_eof():  # the terminator came with the last event (usual): no timer needed
        return
    try:
        async with asyncio.timeout(1.0):
            for _ in range(4):
                if content.is_eof() or not await content.readany():
                    return
    except (TimeoutError, aiohttp.ClientError, OSError):
        return
