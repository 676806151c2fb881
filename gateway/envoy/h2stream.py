"""One gRPC stream of the EPP's HTTP/2 server: its handler, its messages in, its answers out.

A :class:`Stream` splits the DATA it receives into length-prefixed gRPC messages for its
:class:`StreamHandler`, and writes the handler's answers (``send``, then ``finish`` with
the trailers), waiting in order for the peer's flow-control window when it is spent.

Every byte a stream keeps for its peer (a message not yet whole, what its handler holds
through :meth:`Stream.hold`, answers waiting for window) is charged to the stream, its
connection and the process (:mod:`gateway.envoy.h2guard`); a stream that would exceed a
bound is reset (RST_STREAM ENHANCE_YOUR_CALM, or RESOURCE_EXHAUSTED while it may still
answer) and its bytes freed.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable
from typing import Protocol
from urllib.parse import quote

from gateway.envoy.h2guard import Limits, MemoryPool
from gateway.envoy.h2wire import (
    _RESPONSE_HEADERS,
    _U32,
    DATA,
    END_HEADERS,
    END_STREAM,
    ENHANCE_YOUR_CALM,
    GRPC_INTERNAL,
    GRPC_OK,
    GRPC_RESOURCE_EXHAUSTED,
    GRPC_UNIMPLEMENTED,
    HEADERS,
    RST_STREAM,
    _frame,
)
from gateway.envoy.hpack_cache import literal

log = logging.getLogger("gateway.envoy.h2")

# What one kept part of a message costs beyond its bytes: the bytes object's header, the
# allocator's rounding and the list's slot (CPython, 64-bit).
_PART_OVERHEAD = 64


class Connection(Protocol):
    """What a stream needs of its connection (``H2Connection`` in ``h2.py`` is the one):
    its limits and memory accounts, flow-control windows, and the output path. A protocol
    here keeps the stream module below the connection in the import graph."""

    limits: Limits
    pool: MemoryPool
    peer_host: str  # the peer's address (which Envoy this is), "" where unknown
    mem: int
    peer_initial_window: int
    peer_max_frame: int

    def write(self, data: bytes) -> None: ...
    def write_data(self, sid: int, payload: bytes, flags: int) -> None: ...
    def try_reserve(self, stream: Stream, n: int) -> bool: ...
    def reserve_some(self, stream: Stream, n: int) -> int: ...
    def blocked(self, stream: Stream) -> None: ...
    def unblocked(self, stream: Stream) -> None: ...
    def forget(self, stream: Stream) -> None: ...
    def stream_done(self, stream: Stream) -> None: ...
    def overdrawn(self) -> None: ...


class StreamHandler(Protocol):
    """What a service does with one stream: called from inside ``data_received``."""

    def on_message(self, message: bytes) -> None: ...

    def on_end(self) -> None:
        """The peer half-closed the stream (sent END_STREAM): no more messages."""
        ...

    def on_reset(self) -> None:
        """The stream died before the handler finished it (RST_STREAM, connection lost,
        timeout): release what it holds. Not called after :meth:`Stream.finish`."""
        ...

    @property
    def awaiting(self) -> bool:
        """The handler waits for the peer's next message: silence past the message timeout
        ends the stream (:meth:`H2Connection.expire`). False while the peer may rightly stay
        silent (an ext_proc stream between the routing and the response's end)."""
        ...


# A service: given the new stream, its handler (None: the path is not served).
Services = Callable[["Stream"], "StreamHandler | None"]


_MESSAGE_PREFIX = struct.Struct(">BI")  # a gRPC message's: compressed flag, length
_OK = literal("grpc-status", "0")


def _lookup(headers: tuple[tuple[str, str], ...], name: str) -> str | None:
    for k, v in headers:
        if k == name:
            return v
    return None


class Stream:
    __slots__ = (
        "_headers_sent",
        "_held",
        "_parts",
        "_parts_mem",
        "_pending",
        "conn",
        "finished",
        "handler",
        "headers",
        "id",
        "last_activity",
        "mem",
        "path",
        "recv_unacked",
        "recv_window",
        "remote_closed",
        "send_window",
    )

    def __init__(self, conn: Connection, stream_id: int, headers: tuple[tuple[str, str], ...]) -> None:
        self.conn = conn
        self.id = stream_id
        self.headers = headers
        self.path = _lookup(headers, ":path") or ""
        self.handler: StreamHandler | None = None
        self.send_window = conn.peer_initial_window
        self._pending: list[tuple[bytes, int]] = []  # DATA payloads (and flags) waiting for window
        # A message that came in parts: the DATA payloads as they came (no regrowing buffer,
        # whose spare capacity and copies the memory bounds would not see), joined once whole.
        self._parts: list[bytes] = []
        self._held = 0  # payload bytes in _parts
        self._headers_sent = False
        self.finished = False
        self.remote_closed = False
        self.recv_unacked = 0
        self.recv_window = conn.limits.stream_window  # what the peer may still send us
        self.mem = 0  # bytes charged (partial message, held by the handler, queued output)
        self._parts_mem = 0  # of which the partial message (its bytes and each part's overhead)
        self.last_activity = time.monotonic()

    def header(self, name: str) -> str | None:
        return _lookup(self.headers, name)

    # -- memory ------------------------------------------------------------------------
    def charge(self, n: int) -> bool:
        """Take ``n`` bytes from the stream's, the connection's and the process's bounds."""
        conn, lim = self.conn, self.conn.limits
        if self.mem + n > lim.stream_memory or conn.mem + n > lim.connection_memory:
            return False
        if not conn.pool.take(n):
            return False
        self.mem += n
        conn.mem += n
        return True

    def uncharge(self, n: int) -> None:
        n = min(n, self.mem)
        self.mem -= n
        self.conn.mem -= n
        self.conn.pool.give(n)

    def hold(self, n: int) -> bool:
        """The handler keeps ``n`` more bytes for this stream (a body in pieces); False: over
        a bound, the stream is ended (RESOURCE_EXHAUSTED) and the handler told."""
        if self.charge(n):
            return True
        self.abort(GRPC_RESOURCE_EXHAUSTED, "over the EPP's memory bound")
        self.conn.overdrawn()
        return False

    def release(self) -> None:
        """Free everything the stream holds (it is gone: finished, reset or disconnected)."""
        self._drop_parts()
        self._parts_mem = 0
        if self._pending:
            self._pending.clear()
            self.conn.unblocked(self)
        self.uncharge(self.mem)

    def reset(self, code: int = ENHANCE_YOUR_CALM) -> None:
        """End the stream at once with RST_STREAM ``code``: what it holds and what waits to
        be sent is dropped; the handler, if any, is told."""
        handler, self.handler = self.handler, None
        was_finished, self.finished = self.finished, True
        self.conn.write(_frame(RST_STREAM, 0, self.id, _U32.pack(code)))
        self.release()
        self.conn.forget(self)
        if handler is not None and not was_finished:
            handler.on_reset()

    # -- sending -----------------------------------------------------------------------
    def send(self, message: bytes) -> None:
        """Send one gRPC message (uncompressed) on this stream."""
        if self.finished:
            return
        payload = _MESSAGE_PREFIX.pack(0, len(message)) + message
        conn, n = self.conn, len(payload)
        if not self._pending and n <= conn.peer_max_frame and conn.try_reserve(self, n):
            # the common case: one frame, the window has room (with the response headers
            # before it, in the same write, if it is the stream's first message)
            frame = _frame(DATA, 0, self.id, payload)
            if not self._headers_sent:
                self._headers_sent = True
                frame = _frame(HEADERS, END_HEADERS, self.id, _RESPONSE_HEADERS) + frame
            conn.write(frame)
            return
        if not self._headers_sent:
            self._headers_sent = True
            conn.write(_frame(HEADERS, END_HEADERS, self.id, _RESPONSE_HEADERS))
        self._data(payload, 0)

    def finish(self, status: int = GRPC_OK, message: str = "") -> None:
        """End the stream with gRPC trailers (a trailers-only response if nothing was sent)."""
        if self.finished:
            return
        self.finished = True
        self.handler = None  # on_reset is not called after finish, even if the trailers wait
        block = _OK if status == GRPC_OK else literal("grpc-status", str(status))
        if message:
            block += literal("grpc-message", quote(message[:200], safe=" !#$&'()*+,/:;=?@[]~"))
        if not self._headers_sent:
            self._headers_sent = True
            block = _RESPONSE_HEADERS + block
        self._drop_parts()  # a partial message will never be read now
        if self._pending:  # trailers go after the queued data
            self._pending.append((block, -1))
        else:
            self.conn.write(_frame(HEADERS, END_HEADERS | END_STREAM, self.id, block))
            self.conn.stream_done(self)

    def _data(self, payload: bytes, flags: int) -> None:
        if not self._pending and self.conn.try_reserve(self, len(payload)):
            self.conn.write_data(self.id, payload, flags)  # the common case: the window has room
            return
        if not self.charge(len(payload)):  # the peer does not read what it asked for
            self.reset()
            self.conn.overdrawn()
            return
        self._pending.append((payload, flags))
        if len(self._pending) == 1:
            self.conn.blocked(self)
            self.flush_pending()  # what the window has room for goes now

    def flush_pending(self) -> None:
        """Send what waited for the peer's window, in order, as far as it allows: a payload
        larger than the window goes in parts, since a peer may grant more window only once
        it has received what the last grant allowed (gRPC C-core and Envoy do)."""
        while self._pending:
            payload, flags = self._pending[0]
            if flags == -1:  # trailers
                self._pending.pop(0)
                self.conn.unblocked(self)
                self.conn.write(_frame(HEADERS, END_HEADERS | END_STREAM, self.id, payload))
                self.conn.stream_done(self)
                return
            n = self.conn.reserve_some(self, len(payload))
            if n < len(payload):
                if n > 0:
                    self._pending[0] = (payload[n:], flags)
                    self.uncharge(n)
                    self.conn.write_data(self.id, payload[:n], 0)
                return
            self._pending.pop(0)
            self.uncharge(len(payload))
            self.conn.write_data(self.id, payload, flags)
        self.conn.unblocked(self)

    # -- receiving ---------------------------------------------------------------------
    def feed(self, data: bytes, max_message: int) -> None:
        self.last_activity = time.monotonic()
        if self.finished:  # ended on our side (its trailers may wait for window): drop, keep nothing
            self._account()
            return
        parts = self._parts
        if parts:  # a message came in parts: kept until it is whole
            parts.append(data)
            self._held += len(data)
            head = self._head()
            if (
                len(head) < 5
                or not self._sound(head, 0, max_message)
                or self._held < 5 + _U32.unpack_from(head, 1)[0]
            ):
                self._account()
                return
            data = b"".join(parts)
            self._drop_parts()
            parts = self._parts
        # Messages are sliced straight from the DATA payload (one copy each).
        pos, n = 0, len(data)
        while n - pos >= 5 and not self.finished:
            if not self._sound(data, pos, max_message):
                self._account()
                return
            end = pos + 5 + _U32.unpack_from(data, pos + 1)[0]
            if end > n:
                break
            message = data[pos + 5 : end]
            pos = end
            if self.handler is not None:
                try:
                    self.handler.on_message(message)
                except Exception:  # a handler bug costs its stream, not the connection
                    log.exception("EPP: a stream's handler failed")
                    self.abort(GRPC_INTERNAL, "internal error")
        if pos < n and not self.finished:
            parts.append(data[pos:] if pos else data)
            self._held = n - pos
        self._account()

    def held(self) -> int:
        """Payload bytes kept of a message still in parts."""
        return self._held

    def _head(self) -> bytes:
        """The first (up to) 5 bytes of the message in parts: its gRPC prefix."""
        parts = self._parts
        return parts[0][:5] if len(parts[0]) >= 5 else b"".join(parts[:5])[:5]

    def _drop_parts(self) -> None:
        self._parts = []
        self._held = 0

    def _account(self) -> None:
        """Charge (or free) the growth of the partial message; over a bound, the stream ends.
        Each part costs its bytes and the object that holds them (a peer sending 1-byte
        frames pays for what they really take)."""
        grown = self._held + _PART_OVERHEAD * len(self._parts) - self._parts_mem
        if grown > 0 and not self.charge(grown):
            self.abort(GRPC_RESOURCE_EXHAUSTED, "over the EPP's memory bound")
            self._drop_parts()
            grown = -self._parts_mem
            self.conn.overdrawn()
        elif grown < 0:
            self.uncharge(-grown)
        self._parts_mem += grown

    def awaited(self) -> int:
        """Bytes still to come of the message in progress (0: none in progress)."""
        if self._held < 5 or self.finished:
            return 0
        (length,) = _U32.unpack_from(self._head(), 1)
        return max(0, 5 + int(length) - self._held)

    def _sound(self, buf: bytes | bytearray, pos: int, max_message: int) -> bool:
        """Whether the message whose 5-byte gRPC prefix is at ``pos`` can be taken (else the
        stream is aborted)."""
        (length,) = _U32.unpack_from(buf, pos + 1)
        if length > max_message:
            self.abort(GRPC_RESOURCE_EXHAUSTED, f"message of {length} bytes exceeds {max_message}")
            return False
        if buf[pos]:
            self.abort(GRPC_UNIMPLEMENTED, "compressed messages are not supported")
            return False
        return True

    def abort(self, status: int, message: str) -> None:
        """End the stream with an error status and tell the handler it is gone."""
        handler = self.handler
        self.handler = None
        self.finish(status, message)
        if handler is not None:
            handler.on_reset()
