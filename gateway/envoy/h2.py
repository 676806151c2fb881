"""A small HTTP/2 server for gRPC, on an asyncio protocol: the EPP's transport.

Envoy's ``ext_proc`` filter opens one gRPC stream per HTTP request and sends a few small
messages on it. Every general-purpose Python gRPC server tried spent 300-450 µs of CPU per
such stream (grpc.aio, a trivial servicer, measured behind Envoy), as much as specgate's
whole HTTP proxy path; the point of the EPP mode is to be far cheaper than that. This
server does only what a gRPC server needs from HTTP/2 (RFC 9113), synchronously inside
``data_received``:

- the connection preface and SETTINGS (acknowledged; the peer's initial window and maximum
  frame size are applied), PING (answered), GOAWAY (no new streams; closes when idle),
  WINDOW_UPDATE (both directions), RST_STREAM, PRIORITY (ignored), unknown frames (ignored);
- HEADERS + CONTINUATION decoded by HPACK (:mod:`gateway.envoy.hpack_cache`), PADDED and
  PRIORITY flags, a bound on the header block;
- DATA split into length-prefixed gRPC messages (uncompressed only), each handed to the
  stream's handler as bytes; the handler answers with ``Stream.send`` and ends the stream
  with ``Stream.finish`` (trailers with ``grpc-status``): :mod:`.h2stream`;
- flow control: the server grants a 1 GiB receive window up front and tops it up; what it
  sends waits for the peer's window when that is exhausted (:mod:`.h2send`, the sending side).

Protocol errors close the connection with GOAWAY and the RFC's error code; a stream over
the concurrent limit is refused (REFUSED_STREAM); a message larger than the limit ends its
stream with RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import cast

from gateway.envoy.h2send import H2Sender
from gateway.envoy.h2stream import Services, Stream
from gateway.envoy.h2wire import (
    _U32,
    ACK,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    DEFAULT_FRAME_SIZE,
    ENABLE_PUSH,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FRAME_SIZE_ERROR,
    GOAWAY,
    GRPC_DEADLINE_EXCEEDED,
    GRPC_INTERNAL,
    GRPC_INVALID_ARGUMENT,
    GRPC_UNIMPLEMENTED,
    HEADER_BLOCK_MAX,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    MAX_CONCURRENT_STREAMS,
    MAX_HEADER_LIST_SIZE,
    MAX_WINDOW,
    NO_ERROR,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    RECV_WINDOW,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    ConnectionError_,
    _frame,
    _settings_payload,
)
from gateway.envoy.hpack_cache import HeaderDecoder, HpackError

log = logging.getLogger(__name__)


def _incomplete(buf: bytearray) -> bool:
    """``buf`` starts with a frame that has not all come yet (and may come: within the size)."""
    if len(buf) < 9:
        return True
    length = buf[0] << 16 | buf[1] << 8 | buf[2]
    return length <= DEFAULT_FRAME_SIZE and len(buf) < 9 + length


class H2Connection(H2Sender, asyncio.Protocol):
    """One HTTP/2 connection (cleartext with prior knowledge, or TLS with ALPN h2)."""

    def __init__(
        self,
        services: Services,
        *,
        max_streams: int = 4096,
        max_message: int = 64 * 1024 * 1024,
        on_close: Callable[[H2Connection], None] | None = None,
    ) -> None:
        super().__init__()
        self.services = services
        self.max_streams = max_streams
        self.max_message = max_message
        self.on_close = on_close
        self._recv_unacked = 0
        self._buf = bytearray()
        self._preface_seen = False
        self._last_stream = 0
        self._header_stream: int | None = None  # a header block still in CONTINUATIONs
        self._header_block = bytearray()
        self._header_end_stream = False
        self._decoder = HeaderDecoder(HEADER_BLOCK_MAX)
        self._going_away = False
        self.last_activity = time.monotonic()
        self.done: asyncio.Future[None] | None = None  # set when the connection is lost
        self.peer_host = ""  # the peer's address (which Envoy this is), where known

    # -- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self.done = asyncio.get_running_loop().create_future()
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and peer and isinstance(peer[0], str):
            self.peer_host = peer[0]
        settings = {
            MAX_CONCURRENT_STREAMS: self.max_streams,
            INITIAL_WINDOW_SIZE: RECV_WINDOW,
            MAX_HEADER_LIST_SIZE: HEADER_BLOCK_MAX,
            ENABLE_PUSH: 0,
        }
        self.transport.write(
            _frame(SETTINGS, 0, 0, _settings_payload(settings))
            + _frame(WINDOW_UPDATE, 0, 0, _U32.pack(RECV_WINDOW - 65_535))
        )

    def data_received(self, data: bytes) -> None:
        self.last_activity = time.monotonic()
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
                if len(data) < len(PREFACE):
                    if not PREFACE.startswith(data):
                        raise ConnectionError_(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                    buf += data
                    return
                if not data.startswith(PREFACE):
                    raise ConnectionError_(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                data = data[len(PREFACE) :]
                self._preface_seen = True
            # Frames are sliced straight from the bytes read (one copy per payload).
            pos, n = 0, len(data)
            while n - pos >= 9:
                length = data[pos] << 16 | data[pos + 1] << 8 | data[pos + 2]
                if length > DEFAULT_FRAME_SIZE:  # we never raise SETTINGS_MAX_FRAME_SIZE
                    raise ConnectionError_(FRAME_SIZE_ERROR, f"frame of {length} bytes")
                end = pos + 9 + length
                if end > n:
                    break
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
        except ConnectionError_ as exc:
            self._goaway(exc.code, str(exc))
        finally:
            self._batching = False
            self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        streams, self.streams = self.streams, {}
        for s in streams.values():
            handler, s.handler = s.handler, None
            s.finished = True
            if handler is not None:
                handler.on_reset()
        if self.done is not None and not self.done.done():
            self.done.set_result(None)
        if self.on_close is not None:
            self.on_close(self)

    def stream_done(self, stream: Stream) -> None:
        """Our side ended ``stream``; forget it once both sides are done."""
        stream.handler = None
        if stream.remote_closed:
            self.streams.pop(stream.id, None)
        else:  # the peer may still send on it: reset it so it need not
            self.streams.pop(stream.id, None)
            self.write(_frame(RST_STREAM, 0, stream.id, _U32.pack(NO_ERROR)))
        if self._going_away and not self.streams:
            self.close()

    def close(self) -> None:
        self._flush()
        if self.transport is not None and not self.closed:
            self.transport.close()

    def _goaway(self, code: int, why: str) -> None:
        if code != NO_ERROR:
            log.warning("EPP: closing an HTTP/2 connection: %s (error %d)", why, code)
        self.write(_frame(GOAWAY, 0, 0, _U32.pack(self._last_stream) + _U32.pack(code)))
        self._flush()
        if self.transport is not None:
            self.transport.close()
        self.closed = True

    def shutdown(self) -> None:
        """Graceful: no new streams; close once those open have ended."""
        self._going_away = True
        self.write(_frame(GOAWAY, 0, 0, _U32.pack(MAX_WINDOW) + _U32.pack(NO_ERROR)))
        if not self.streams:
            self.close()

    def expire(self, now: float, message_timeout_s: float) -> None:
        """End the streams whose handler waits for a message that has not come for
        ``message_timeout_s``."""
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
        if kind == DATA:
            self._on_data(flags, sid, payload)
        elif kind == HEADERS:
            self._on_headers(flags, sid, payload)
        elif kind == CONTINUATION:
            self._on_continuation(flags, sid, payload)
        elif kind == SETTINGS:
            self._on_settings(flags, sid, payload)
        elif kind == WINDOW_UPDATE:
            self._on_window_update(sid, payload)
        elif kind == PING:
            if sid != 0 or len(payload) != 8:
                raise ConnectionError_(PROTOCOL_ERROR, "malformed PING")
            if not flags & ACK:
                self.write(_frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            if sid == 0 or len(payload) != 4:
                raise ConnectionError_(PROTOCOL_ERROR, "malformed RST_STREAM")
            s = self.streams.pop(sid, None)
            if s is not None:
                s.finished = True
                handler, s.handler = s.handler, None
                if handler is not None:
                    handler.on_reset()
        elif kind == GOAWAY:
            self._going_away = True
            if not self.streams:
                self.close()
        elif kind == PUSH_PROMISE:
            raise ConnectionError_(PROTOCOL_ERROR, "a client must not push")
        elif kind == PRIORITY and sid == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "PRIORITY on stream 0")
        # other frame types are ignored (RFC 9113 §4.1)

    def _on_data(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        if flags & PADDED:
            if not payload or payload[0] >= size:
                raise ConnectionError_(PROTOCOL_ERROR, "bad padding")
            payload = payload[1 : size - payload[0]]
        # Flow control counts the whole frame payload, padding included.
        self._recv_unacked += size
        if self._recv_unacked >= RECV_WINDOW // 2:
            self.write(_frame(WINDOW_UPDATE, 0, 0, _U32.pack(self._recv_unacked)))
            self._recv_unacked = 0
        s = self.streams.get(sid)
        if s is None:
            if sid > self._last_stream:
                raise ConnectionError_(PROTOCOL_ERROR, "DATA on an idle stream")
            return  # a stream we already ended: the data is dropped
        if s.remote_closed:
            raise ConnectionError_(STREAM_CLOSED, "DATA after END_STREAM")
        s.recv_unacked += size
        if s.recv_unacked >= RECV_WINDOW // 2 and not flags & END_STREAM:
            self.write(_frame(WINDOW_UPDATE, 0, sid, _U32.pack(s.recv_unacked)))
            s.recv_unacked = 0
        if payload:
            s.feed(payload, self.max_message)
        if flags & END_STREAM:
            self._remote_end(s)

    def _on_headers(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0 or not sid & 1:
            raise ConnectionError_(PROTOCOL_ERROR, "HEADERS on an invalid stream id")
        if flags & PADDED:
            if not payload or payload[0] >= len(payload):
                raise ConnectionError_(PROTOCOL_ERROR, "bad padding")
            payload = payload[1 : len(payload) - payload[0]]
        if flags & PRIORITY_FLAG:
            payload = payload[5:]
        self._header_end_stream = bool(flags & END_STREAM)
        if flags & END_HEADERS:  # the whole block in one frame: no copy
            self._header_done(sid, payload)
            return
        self._header_stream = sid
        self._header_block = bytearray(payload)

    def _on_continuation(self, flags: int, sid: int, payload: bytes) -> None:
        if self._header_stream is None or sid != self._header_stream:
            raise ConnectionError_(PROTOCOL_ERROR, "unexpected CONTINUATION")
        self._header_block += payload
        if len(self._header_block) > HEADER_BLOCK_MAX:
            raise ConnectionError_(ENHANCE_YOUR_CALM, "header block too large")
        if flags & END_HEADERS:
            block = bytes(self._header_block)
            self._header_stream = None
            self._header_block = bytearray()
            self._header_done(sid, block)

    def _header_done(self, sid: int, block: bytes) -> None:
        try:
            fields = self._decoder.decode(block)
        except HpackError as exc:
            raise ConnectionError_(COMPRESSION_ERROR, str(exc)) from None
        s = self.streams.get(sid)
        if s is not None:  # trailers from the client: only END_STREAM matters
            if self._header_end_stream:
                self._remote_end(s)
            return
        if sid <= self._last_stream:
            return  # trailers of a stream already ended on our side
        self._last_stream = sid
        if self._going_away:
            self.write(_frame(RST_STREAM, 0, sid, _U32.pack(REFUSED_STREAM)))
            return
        if len(self.streams) >= self.max_streams:
            self.write(_frame(RST_STREAM, 0, sid, _U32.pack(REFUSED_STREAM)))
            return
        s = Stream(self, sid, fields)
        # half-closed (remote) already: a stream finished below needs no RST_STREAM
        s.remote_closed = self._header_end_stream
        self.streams[sid] = s
        method = s.header(":method")
        ctype = s.header("content-type") or ""
        if method != "POST" or not ctype.startswith("application/grpc"):
            s.finish(GRPC_INVALID_ARGUMENT, "gRPC only: POST with content-type application/grpc")
            return
        try:
            s.handler = self.services(s)
        except Exception:  # a service that fails to open costs that stream only
            log.exception("EPP: opening a stream failed")
            s.finish(GRPC_INTERNAL, "internal error")
            return
        if s.handler is None:
            s.finish(GRPC_UNIMPLEMENTED, f"unknown method {s.path[:100]}")
            return
        if self._header_end_stream:
            self._remote_end(s)

    def _remote_end(self, s: Stream) -> None:
        s.remote_closed = True
        if s.finished:
            if not s._pending:  # else its trailers wait for window: stream_done forgets it
                self.streams.pop(s.id, None)
            return
        if s.handler is not None:
            try:
                s.handler.on_end()
            except Exception:
                log.exception("EPP: a stream's handler failed at its end")
                s.abort(GRPC_INTERNAL, "internal error")
