"""A small HTTP/2 server for gRPC, on an asyncio protocol: the EPP's transport.

Envoy's ``ext_proc`` filter opens one gRPC stream per HTTP request and sends a few small
messages on it. This server does only what a gRPC server needs from HTTP/2 (RFC 9113),
synchronously inside ``data_received``:

- the connection preface and SETTINGS (acknowledged; the peer's initial window and maximum
  frame size are applied), PING (answered), GOAWAY (no new streams; closes when idle),
  WINDOW_UPDATE (both directions), RST_STREAM, PRIORITY (ignored), unknown frames (ignored);
- HEADERS + CONTINUATION decoded by HPACK (:mod:`gateway.envoy.hpack_cache`), PADDED and
  PRIORITY flags, a bound on the header block (:mod:`.h2recv`, the receiving side);
- DATA split into length-prefixed gRPC messages (uncompressed only), each handed to the
  stream's handler as bytes; the handler answers with ``Stream.send`` and ends the stream
  with ``Stream.finish`` (trailers with ``grpc-status``): :mod:`.h2stream`;
- flow control: receive windows granted again only for what was consumed (:mod:`.h2recv`);
  what the server sends waits for the peer's window when that is spent (:mod:`.h2send`).

What one peer may cost is bounded (:mod:`.h2guard`): frame-rate budgets (PING, SETTINGS,
early RST_STREAM, CONTINUATION, WINDOW_UPDATE, empty frames, new streams) whose crossing
ends the connection with GOAWAY ENHANCE_YOUR_CALM at once; memory per stream, per
connection and per process; reading pauses while the socket's output is queued (the peer
does not read) and between slices of ``slice_s`` seconds, so that one connection's bytes
never hold the event loop for longer than a slice.

Protocol errors close the connection with GOAWAY and the RFC's error code; a stream over
the concurrent limit is refused (REFUSED_STREAM); a message larger than the limit ends its
stream with RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import cast

from gateway.envoy.h2guard import (
    CONTINUATION_B,
    OTHER_B,
    PING_B,
    RESET_B,
    SETTINGS_B,
    UNBOUNDED,
    WINDOW_B,
    Budgets,
    Calm,
    Limits,
    MemoryPool,
    Turn,
)
from gateway.envoy.h2recv import H2Receiver
from gateway.envoy.h2stream import Services, Stream
from gateway.envoy.h2wire import (
    _U32,
    ACK,
    CONTINUATION,
    DATA,
    DEFAULT_FRAME_SIZE,
    ENABLE_PUSH,
    ENHANCE_YOUR_CALM,
    FRAME_SIZE_ERROR,
    GOAWAY,
    GRPC_DEADLINE_EXCEEDED,
    HEADER_BLOCK_MAX,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    MAX_CONCURRENT_STREAMS,
    MAX_HEADER_LIST_SIZE,
    MAX_WINDOW,
    NO_ERROR,
    PING,
    PREFACE,
    PRIORITY,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
    ConnectionError_,
    _frame,
    _settings_payload,
)

log = logging.getLogger(__name__)


def _incomplete(buf: bytearray) -> bool:
    """``buf`` starts with a frame that has not all come yet (and may come: within the size)."""
    if len(buf) < 9:
        return True
    length = buf[0] << 16 | buf[1] << 8 | buf[2]
    return length <= DEFAULT_FRAME_SIZE and len(buf) < 9 + length


class H2Connection(H2Receiver, asyncio.Protocol):
    """One HTTP/2 connection (cleartext with prior knowledge, or TLS with ALPN h2)."""

    def __init__(
        self,
        services: Services,
        *,
        max_streams: int = 1024,
        max_message: int = 64 * 1024 * 1024,
        limits: Limits | None = None,
        pool: MemoryPool = UNBOUNDED,
        turn: Turn | None = None,
        overdrawn_turn: Turn | None = None,
        on_close: Callable[[H2Connection], None] | None = None,
    ) -> None:
        lim = limits or Limits()
        # a whole message of the largest size must fit the windows and the stream's bound
        lim = replace(
            lim,
            stream_memory=max(lim.stream_memory, max_message + 5),
            connection_memory=max(lim.connection_memory, max_message + 5),
            connection_window=max(lim.connection_window, max_message + 5, 65_536),
        )
        super().__init__(lim, pool)
        self.services = services
        self.max_streams = max_streams
        self.max_message = max_message
        self.on_close = on_close
        self.budgets = Budgets(lim)
        # the loop's time all the server's connections share (their own when none is given)
        self.turn = turn if turn is not None else Turn(lim.slice_s)
        # the slower line for a peer that had streams ended for memory (overdrawn())
        self._overdrawn_turn = (
            overdrawn_turn if overdrawn_turn is not None else Turn(lim.slice_s, lim.overdrawn_share)
        )
        self.overdrawn_streams = 0
        self._init_receiver()
        self._buf = bytearray()
        self._rest, self._rest_pos = b"", 0  # a read a slice did not finish, and where it stopped
        self._preface_seen = False
        self._going_away = False
        self._paused: set[str] = set()  # why reading is paused: "write" (output queued), "slice"
        self.stalled_since: float | None = None  # output queued past the bound since then
        self._now = self.last_activity = time.monotonic()
        self.done: asyncio.Future[None] | None = None  # set when the connection is lost
        self.peer_host = ""  # the peer's address (which Envoy this is), where known
        self.peer_cert: object = None  # the peer's TLS certificate, where it showed one
        self.error_code: int | None = None  # the GOAWAY error code that ended it, if we did

    # -- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.done = asyncio.get_running_loop().create_future()
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and peer and isinstance(peer[0], str):
            self.peer_host = peer[0]
        self.peer_cert = transport.get_extra_info("peercert")
        limits = getattr(transport, "set_write_buffer_limits", None)
        if limits is not None:
            limits(high=self.limits.write_buffer)
        settings = {
            MAX_CONCURRENT_STREAMS: self.max_streams,
            INITIAL_WINDOW_SIZE: self.limits.stream_window,
            MAX_HEADER_LIST_SIZE: HEADER_BLOCK_MAX,
            ENABLE_PUSH: 0,
        }
        self.transport.write(
            _frame(SETTINGS, 0, 0, _settings_payload(settings))
            + _frame(WINDOW_UPDATE, 0, 0, _U32.pack(self.limits.connection_window - 65_535))
        )

    def pause_writing(self) -> None:
        """The peer does not read what we send: stop reading what it sends (TCP backpressure)."""
        self.stalled_since = time.monotonic()
        self._pause("write")

    def resume_writing(self) -> None:
        self.stalled_since = None
        self._resume("write")

    def overdrawn(self) -> None:
        """One of this peer's streams was ended for memory: it asked the EPP to hold more than
        its bounds allow. From now on its frames wait in the slower line (``overdrawn_share``
        of the loop for all such peers): flow control and the bounds keep its memory in check,
        this keeps the CPU it costs in check."""
        self.overdrawn_streams += 1
        self.turn = self._overdrawn_turn

    def _pause(self, why: str) -> None:
        if not self._paused and self.transport is not None and not self.closed:
            self.transport.pause_reading()
        self._paused.add(why)

    def _resume(self, why: str) -> None:
        if why not in self._paused:
            return
        self._paused.discard(why)
        if not self._paused and self.transport is not None and not self.closed:
            self.transport.resume_reading()
            if (self._buf or self._rest) and why != "slice":
                self._next_slice()

    def _next_slice(self) -> None:
        if "slice" in self._paused:
            self._paused.discard("slice")
            if self._paused:  # still paused for output: resume_writing goes on
                return
            if self.transport is not None and not self.closed:
                self.transport.resume_reading()
        if not self.closed and not self._paused:
            self.data_received(b"")

    def data_received(self, data: bytes) -> None:
        self._now = self.last_activity = time.monotonic()
        start = 0
        if self._rest:  # what a slice left of the last read: from where it stopped, no copy
            rest, start, self._rest = self._rest, self._rest_pos, b""
            data = rest + data if data else rest
        buf = self._buf
        if buf:  # a frame came in parts: kept until it is whole
            buf += data
            if self._preface_seen and _incomplete(buf):
                return
            data = bytes(buf)
            buf.clear()
        elif type(data) is not bytes:
            data = bytes(data)
        self._batching = True
        try:
            if not self._preface_seen:
                data = data[start:]
                start = 0
                if len(data) < len(PREFACE):
                    if not PREFACE.startswith(data):
                        raise ConnectionError_(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                    buf += data
                    return
                if not data.startswith(PREFACE):
                    raise ConnectionError_(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                data = data[len(PREFACE) :]
                self._preface_seen = True
            # Frames are sliced straight from the bytes read (one copy per payload), for at
            # most a slice, and no longer than what this turn of the loop has left (Turn).
            pos, n = start, len(data)
            if self.turn.exhausted() and n - pos >= 9:  # spent by other connections: after them
                self._rest, self._rest_pos = data, pos
                self._pause("slice")
                self.turn.wait(self._next_slice)
                return
            until, count = self._now + min(self.limits.slice_s, self.turn.left()), 0
            while n - pos >= 9:
                length = data[pos] << 16 | data[pos + 1] << 8 | data[pos + 2]
                if length > DEFAULT_FRAME_SIZE:  # we never raise SETTINGS_MAX_FRAME_SIZE
                    raise ConnectionError_(FRAME_SIZE_ERROR, f"frame of {length} bytes")
                end = pos + 9 + length
                if end > n:
                    break
                count += 1
                if not count & 31 and time.monotonic() > until:  # the rest after the loop's other work
                    self._rest, self._rest_pos = data, pos
                    self._pause("slice")
                    self.turn.wait(self._next_slice)
                    return
                (sid,) = _U32.unpack_from(data, pos + 5)
                kind = data[pos + 3]
                if kind == DATA and self._header_stream is None:  # the most frequent, directly
                    self._on_data(data[pos + 4], sid & 0x7FFFFFFF, data[pos + 9 : end])
                else:
                    self._frame(kind, data[pos + 4], sid & 0x7FFFFFFF, data[pos + 9 : end])
                pos = end
                if self.closed:
                    return
            if pos < n:
                buf += memoryview(data)[pos:]
        except Calm as exc:
            self._goaway(ENHANCE_YOUR_CALM, str(exc))
        except ConnectionError_ as exc:
            self._goaway(exc.code, str(exc))
        finally:
            self._batching = False
            self._flush()
            self.turn.charge(time.monotonic() - self._now)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._buf = bytearray()
        self._rest = b""
        streams, self.streams = self.streams, {}
        for s in streams.values():
            handler, s.handler = s.handler, None
            s.finished = True
            s.release()
            if handler is not None:
                handler.on_reset()
        if self.done is not None and not self.done.done():
            self.done.set_result(None)
        if self.on_close is not None:
            self.on_close(self)

    def stream_done(self, stream: Stream) -> None:
        """Our side ended ``stream``; forget it once both sides are done."""
        stream.handler = None
        if not stream.remote_closed:  # the peer may still send on it: reset it so it need not
            self.write(_frame(RST_STREAM, 0, stream.id, _U32.pack(NO_ERROR)))
        self.forget(stream)
        if self._going_away and not self.streams:
            self.close()

    def close(self) -> None:
        self._flush()
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True  # nothing more is read or written

    def _goaway(self, code: int, why: str) -> None:
        self.error_code = code
        if code != NO_ERROR:
            log.warning(
                "EPP: closing an HTTP/2 connection from %s: %s (error %d)",
                self.peer_host or "?",
                why,
                code,
                extra={"throttle_key": f"epp_goaway_{code}"},
            )
        self.write(_frame(GOAWAY, 0, 0, _U32.pack(self._last_stream) + _U32.pack(code)))
        self._flush()
        t = self.transport
        if t is not None:
            queued = getattr(t, "get_write_buffer_size", lambda: 0)()
            if queued and code != NO_ERROR:  # a peer that does not read: no waiting for it
                t.abort()
            else:
                t.close()
        self.closed = True

    def shutdown(self) -> None:
        """Graceful: no new streams; close once those open have ended."""
        self._going_away = True
        self.write(_frame(GOAWAY, 0, 0, _U32.pack(MAX_WINDOW) + _U32.pack(NO_ERROR)))
        if not self.streams:
            self.close()

    def expire(self, now: float, message_timeout_s: float, stall_timeout_s: float = 0.0) -> None:
        """End the streams whose handler waits for a message that has not come for
        ``message_timeout_s``; abort the connection when its peer has not read what it was
        sent for ``stall_timeout_s`` (0: never)."""
        if stall_timeout_s and self.stalled_since is not None and now - self.stalled_since > stall_timeout_s:
            log.warning("EPP: aborting a connection that reads nothing", extra={"throttle_key": "epp_stall"})
            if self.transport is not None:
                self.transport.abort()
            self.closed = True
            return
        late = [
            s
            for s in self.streams.values()
            if now - s.last_activity > message_timeout_s and (s.handler is None or s.handler.awaiting)
        ]
        for s in late:
            s.abort(GRPC_DEADLINE_EXCEEDED, f"no message for {message_timeout_s:g} s")
        self._flush()

    # -- frames ----------------------------------------------------------------------
    def _frame(self, kind: int, flags: int, sid: int, payload: bytes) -> None:
        if self._header_stream is not None and kind != CONTINUATION:
            raise ConnectionError_(PROTOCOL_ERROR, "header block interrupted")
        now = self._now
        if kind == DATA:
            self._on_data(flags, sid, payload)
        elif kind == HEADERS:
            self._on_headers(flags, sid, payload)
        elif kind == CONTINUATION:
            self.budgets.charge(CONTINUATION_B, now)
            self._on_continuation(flags, sid, payload)
        elif kind == SETTINGS:
            self.budgets.charge(SETTINGS_B, now)
            self._on_settings(flags, sid, payload)
        elif kind == WINDOW_UPDATE:
            self.budgets.charge(WINDOW_B, now)
            self._on_window_update(sid, payload)
        elif kind == PING:
            self.budgets.charge(PING_B, now)
            if sid != 0 or len(payload) != 8:
                raise ConnectionError_(PROTOCOL_ERROR, "malformed PING")
            if not flags & ACK:
                self.write(_frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            if sid == 0 or len(payload) != 4:
                raise ConnectionError_(PROTOCOL_ERROR, "malformed RST_STREAM")
            s = self.streams.get(sid)
            if s is None:
                if sid > self._last_stream:
                    raise ConnectionError_(PROTOCOL_ERROR, "RST_STREAM on an idle stream")
                self.budgets.charge(OTHER_B, now)
                return
            if not s._headers_sent:  # reset before we answered: what rapid reset does
                self.budgets.charge(RESET_B, now)
            s.finished = True
            handler, s.handler = s.handler, None
            self.forget(s)
            if handler is not None:
                handler.on_reset()
        elif kind == GOAWAY:
            self.budgets.charge(OTHER_B, now)
            if sid != 0 or len(payload) < 8:
                raise ConnectionError_(PROTOCOL_ERROR if sid else FRAME_SIZE_ERROR, "malformed GOAWAY")
            self._going_away = True
            if not self.streams:
                self.close()
        elif kind == PUSH_PROMISE:
            raise ConnectionError_(PROTOCOL_ERROR, "a client must not push")
        elif kind == PRIORITY and sid == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "PRIORITY on stream 0")
        else:  # PRIORITY and unknown frame types are ignored (RFC 9113 §4.1), within a budget
            self.budgets.charge(OTHER_B, now)
