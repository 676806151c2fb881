"""The sending side of the EPP's HTTP/2 connection (:mod:`gateway.envoy.h2`): writes batched
per read, flow control (RFC 9113 §6.9: the peer's windows, per connection and per stream,
what waits when they are spent) and the peer's SETTINGS that govern them.

:class:`H2Sender` is the base of :class:`~gateway.envoy.h2.H2Connection`; it holds the state
both the connection and its streams (:class:`~gateway.envoy.h2stream.Stream`) write through.
"""

from __future__ import annotations

import asyncio
import struct

from gateway.envoy.h2guard import UNBOUNDED, Limits, MemoryPool
from gateway.envoy.h2stream import Stream
from gateway.envoy.h2wire import (
    _U32,
    ACK,
    DATA,
    DEFAULT_FRAME_SIZE,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    INITIAL_WINDOW_SIZE,
    MAX_FRAME_SIZE,
    MAX_WINDOW,
    PROTOCOL_ERROR,
    SETTINGS,
    ConnectionError_,
    _frame,
)


class H2Sender:
    """Output and flow control of one HTTP/2 connection."""

    def __init__(self, limits: Limits, pool: MemoryPool = UNBOUNDED) -> None:
        self.transport: asyncio.Transport | None = None
        self.limits = limits
        self.pool = pool  # the process's bound on what all connections hold
        self.mem = 0  # bytes this connection's streams hold (see Stream.charge)
        self.streams: dict[int, Stream] = {}
        self._blocked: dict[int, Stream] = {}  # streams whose answers wait for window
        self.peer_initial_window = 65_535
        self.peer_max_frame = DEFAULT_FRAME_SIZE
        self.send_window = 65_535  # the connection's, granted by the peer
        self._out: list[bytes] = []
        self._batching = False  # inside data_received: writes wait for one flush
        self.closed = False

    def blocked(self, stream: Stream) -> None:
        self._blocked[stream.id] = stream

    def unblocked(self, stream: Stream) -> None:
        if not stream._pending:
            self._blocked.pop(stream.id, None)

    def forget(self, stream: Stream) -> None:
        """``stream`` is over: no longer served, what it held freed."""
        if self.streams.get(stream.id) is stream:
            del self.streams[stream.id]
        stream.release()

    def write(self, data: bytes) -> None:
        if self.closed or self.transport is None:
            return
        if self._batching:
            self._out.append(data)
        else:
            self.transport.write(data)

    def _flush(self) -> None:
        if self._out and self.transport is not None and not self.closed:
            self.transport.write(b"".join(self._out))
        self._out.clear()

    def try_reserve(self, stream: Stream, n: int) -> bool:
        if n > self.send_window or n > stream.send_window:
            return False
        self.send_window -= n
        stream.send_window -= n
        return True

    def reserve_some(self, stream: Stream, n: int) -> int:
        """Reserve up to ``n`` bytes of both send windows: how many (0 when either is spent)."""
        n = max(0, min(n, self.send_window, stream.send_window))
        self.send_window -= n
        stream.send_window -= n
        return n

    def write_data(self, sid: int, payload: bytes, flags: int) -> None:
        step = self.peer_max_frame
        if len(payload) <= step:
            self.write(_frame(DATA, flags, sid, payload))
            return
        for i in range(0, len(payload), step):
            last = i + step >= len(payload)
            self.write(_frame(DATA, flags if last else 0, sid, payload[i : i + step]))

    def _on_settings(self, flags: int, sid: int, payload: bytes) -> None:
        if sid != 0 or len(payload) % 6:
            raise ConnectionError_(
                FRAME_SIZE_ERROR if len(payload) % 6 else PROTOCOL_ERROR, "malformed SETTINGS"
            )
        if flags & ACK:
            return
        for i in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HI", payload, i)
            if key == INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ConnectionError_(FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for s in self.streams.values():
                    s.send_window += delta
                    if s.send_window > MAX_WINDOW:
                        raise ConnectionError_(FLOW_CONTROL_ERROR, "a stream's window overflows")
            elif key == MAX_FRAME_SIZE:
                if not DEFAULT_FRAME_SIZE <= value <= (1 << 24) - 1:
                    raise ConnectionError_(PROTOCOL_ERROR, "invalid max frame size")
                self.peer_max_frame = value
        self.write(_frame(SETTINGS, ACK, 0))
        self._unblock()

    def _on_window_update(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ConnectionError_(FRAME_SIZE_ERROR, "malformed WINDOW_UPDATE")
        inc = _U32.unpack(payload)[0] & 0x7FFFFFFF
        if sid == 0:
            if inc == 0:
                raise ConnectionError_(PROTOCOL_ERROR, "WINDOW_UPDATE of 0")
            self.send_window += inc
            if self.send_window > MAX_WINDOW:
                raise ConnectionError_(FLOW_CONTROL_ERROR, "connection window overflow")
            self._unblock()
            return
        s = self.streams.get(sid)
        if s is not None:
            s.send_window += inc
            if s.send_window > MAX_WINDOW:  # RFC 9113 §6.9.1: a stream error
                s.reset(FLOW_CONTROL_ERROR)
                return
            if s._pending:
                s.flush_pending()

    def _unblock(self) -> None:
        """The connection's window grew: what waits goes, stream by stream (only those that
        wait are visited)."""
        for s in list(self._blocked.values()):
            if s._pending and self.send_window > 0:
                s.flush_pending()
