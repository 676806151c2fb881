"""The receiving side of the EPP's HTTP/2 connection (:mod:`gateway.envoy.h2`): DATA,
HEADERS and CONTINUATION, the streams they open, and the receive windows (RFC 9113 §6.9).

The receive windows bound what a peer can make the server keep: the connection's window is
granted again only for bytes *consumed* (whole messages handed to a handler, or dropped),
never for those of a message still in parts, so the partial messages of a connection never
exceed its window. A stream's window is refilled the same way, and grown to the length a
message announces (up to the largest message), so a message larger than the initial window
can still come whole. A stream the server ended may still receive what was in flight, up
to the window it had: a peer that sends past it (that ignores the reset) ends the connection.
"""

from __future__ import annotations

import logging

from gateway.envoy.h2guard import EMPTY_B, RESET_B, STREAMS_B, Budgets
from gateway.envoy.h2send import H2Sender
from gateway.envoy.h2stream import Services, Stream
from gateway.envoy.h2wire import (
    _U32,
    COMPRESSION_ERROR,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    GRPC_INTERNAL,
    GRPC_INVALID_ARGUMENT,
    GRPC_UNIMPLEMENTED,
    HEADER_BLOCK_MAX,
    PADDED,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    REFUSED_STREAM,
    RST_STREAM,
    STREAM_CLOSED,
    WINDOW_UPDATE,
    ConnectionError_,
    _frame,
)
from gateway.envoy.hpack_cache import HeaderDecoder, HpackError

log = logging.getLogger("gateway.envoy.h2")

_CLOSED_KEPT = 1024  # closed streams whose remaining window is remembered


class H2Receiver(H2Sender):
    """Streams opened and fed by the peer's HEADERS and DATA."""

    services: Services
    max_streams: int
    max_message: int
    budgets: Budgets
    _now: float
    _going_away: bool

    def _init_receiver(self) -> None:
        self._recv_window = self.limits.connection_window  # what the peer may still send
        self._recv_unacked = 0  # consumed, not granted again yet
        self._last_stream = 0
        self._header_stream: int | None = None  # a header block still in CONTINUATIONs
        self._header_block = bytearray()
        self._header_end_stream = False
        self._decoder = HeaderDecoder(HEADER_BLOCK_MAX)
        # streams we ended while the peer could still send: what their window still allowed
        self._closed_windows: dict[int, int] = {}

    def forget(self, stream: Stream) -> None:
        super().forget(stream)
        if not stream.remote_closed:  # DATA already in flight may come: no more than its window
            self._closed_windows[stream.id] = max(0, stream.recv_window)
            if len(self._closed_windows) > _CLOSED_KEPT:
                del self._closed_windows[next(iter(self._closed_windows))]

    def consumed(self, n: int) -> None:
        """``n`` bytes of received DATA are no longer kept: the peer may send as many again."""
        self._recv_unacked += n
        if self._recv_unacked >= self.limits.connection_window // 4:
            self.write(_frame(WINDOW_UPDATE, 0, 0, _U32.pack(self._recv_unacked)))
            self._recv_window += self._recv_unacked
            self._recv_unacked = 0

    def _on_data(self, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise ConnectionError_(PROTOCOL_ERROR, "DATA on stream 0")
        size = len(payload)
        if size > self._recv_window:
            raise ConnectionError_(FLOW_CONTROL_ERROR, "DATA beyond the connection's window")
        self._recv_window -= size
        if flags & PADDED:
            if not payload or payload[0] >= size:
                raise ConnectionError_(PROTOCOL_ERROR, "bad padding")
            payload = payload[1 : size - payload[0]]
        elif not size and not flags & END_STREAM:
            self.budgets.charge(EMPTY_B, self._now)
        s = self.streams.get(sid)
        if s is None:
            if sid > self._last_stream:
                raise ConnectionError_(PROTOCOL_ERROR, "DATA on an idle stream")
            left = self._closed_windows.get(sid)
            if left is not None:  # a stream we ended: what was in flight is dropped, no more
                if size > left:
                    raise ConnectionError_(FLOW_CONTROL_ERROR, "DATA past a closed stream's window")
                self._closed_windows[sid] = left - size
            self.consumed(size)
            return
        if s.remote_closed:
            raise ConnectionError_(STREAM_CLOSED, "DATA after END_STREAM")
        if size > s.recv_window:
            self.consumed(size)
            s.reset(FLOW_CONTROL_ERROR)
            return
        s.recv_window -= size
        kept = s.held()
        if payload:
            s.feed(payload, self.max_message)
        grown = s.held() - kept  # kept as part of a message still in parts
        done = size - grown
        self.consumed(done)
        if flags & END_STREAM:
            self._remote_end(s)
        elif not s.finished:
            s.recv_unacked += done
            # grant again what was consumed, and what the message in progress still needs
            grant = max(s.recv_unacked if s.recv_unacked >= self.limits.stream_window // 4 else 0,
                        s.awaited() - s.recv_window)  # fmt: skip
            if grant > 0:
                self.write(_frame(WINDOW_UPDATE, 0, sid, _U32.pack(grant)))
                s.recv_window += grant
                s.recv_unacked = max(0, s.recv_unacked - grant)

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
        if not payload:
            self.budgets.charge(EMPTY_B, self._now)
        self._header_stream = sid
        self._header_block = bytearray(payload)

    def _on_continuation(self, flags: int, sid: int, payload: bytes) -> None:
        if self._header_stream is None or sid != self._header_stream:
            raise ConnectionError_(PROTOCOL_ERROR, "unexpected CONTINUATION")
        if not payload and not flags & END_HEADERS:
            self.budgets.charge(EMPTY_B, self._now)
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
        self.budgets.charge(STREAMS_B, self._now)
        if self._going_away or len(self.streams) >= self.max_streams:
            if not self._going_away:  # past the limit it announced: a peer that resets its way in
                self.budgets.charge(RESET_B, self._now)
            self.write(_frame(RST_STREAM, 0, sid, _U32.pack(REFUSED_STREAM)))
            return
        self.budgets.credit_stream()
        s = Stream(self, sid, fields)  # type: ignore[arg-type]  # an H2Connection, as this is its base
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
            if not s.finished:  # the service may have answered it (refused the peer)
                s.finish(GRPC_UNIMPLEMENTED, f"unknown method {s.path[:100]}")
            return
        if self._header_end_stream:
            self._remote_end(s)

    def _remote_end(self, s: Stream) -> None:
        s.remote_closed = True
        if s.finished:
            if not s._pending:  # else its trailers wait for window: stream_done forgets it
                self.forget(s)
            return
        if s.handler is not None:
            try:
                s.handler.on_end()
            except Exception:
                log.exception("EPP: a stream's handler failed at its end")
                s.abort(GRPC_INTERNAL, "internal error")
