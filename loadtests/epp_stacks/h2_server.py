"""A gRPC server for ext_proc on the ``h2`` library (python-hyper) and an asyncio protocol.

The candidate "maintained HTTP/2 state machine, our own gRPC framing": ``h2`` parses and
validates frames, tracks stream states and flow-control windows, answers PING and SETTINGS
and decodes headers (with ``hpack``, already a dependency); this module adds what ``h2``
leaves to its user:

- gRPC framing: DATA split into length-prefixed messages (uncompressed only), each handed
  to the stream's handler; answers as ``:status 200`` headers, messages, then trailers with
  ``grpc-status``;
- budgets ``h2`` does not have: per connection, PINGs, SETTINGS and streams reset by the
  peer before they were answered (rapid reset) in a one-second window; crossing one ends
  the connection with GOAWAY ENHANCE_YOUR_CALM. A message announced over ``MAX_MESSAGE``
  ends its stream (RESOURCE_EXHAUSTED). DATA is acknowledged as it arrives, so partial
  messages are bounded per stream only (not per connection: a gap of this prototype);
- TCP backpressure: while the transport's write buffer is above its high-water mark the
  connection stops reading, so unread PING and SETTINGS acknowledgements cannot pile up;
- a cap on connections (``Listener.max_connections``).

Its handlers have the interface of :class:`gateway.envoy.h2stream.StreamHandler`
(``on_message``, ``on_end``, ``on_reset``), and the stream object they get has ``send``,
``finish``, ``abort``, ``path``: the same handlers run on this server and the hand-written one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.errors import ErrorCodes
from h2.events import (
    ConnectionTerminated,
    DataReceived,
    PingReceived,
    RemoteSettingsChanged,
    RequestReceived,
    StreamEnded,
    StreamReset,
    WindowUpdated,
)
from h2.exceptions import ProtocolError
from h2.settings import SettingCodes


class Handler(Protocol):
    def on_message(self, message: bytes) -> None: ...
    def on_end(self) -> None: ...
    def on_reset(self) -> None: ...


Services = Callable[["GrpcStream"], Handler | None]

MAX_STREAMS = 128
MAX_MESSAGE = 4 * 1024 * 1024
MAX_HEADER_LIST = 16 * 1024
RECV_WINDOW = 1 << 20  # per stream; the connection's is the default, topped up as read
BUDGET_PER_S = {"ping": 50, "settings": 50, "early_reset": 200}


class GrpcStream:
    """One gRPC call on an :class:`H2Server` connection."""

    __slots__ = ("buf", "conn", "finished", "handler", "headers_sent", "path", "pending", "sid", "trailers")

    def __init__(self, conn: H2Server, sid: int, path: str) -> None:
        self.conn = conn
        self.sid = sid
        self.path = path
        self.buf = bytearray()
        self.handler: Handler | None = None
        self.headers_sent = False
        self.pending = bytearray()  # DATA waiting for the peer's window
        self.trailers: list[tuple[str, str]] | None = None
        self.finished = False

    def send(self, message: bytes) -> None:
        if self.finished:
            return
        if not self.headers_sent:
            self.headers_sent = True
            try:
                self.conn.h2.send_headers(
                    self.sid, [(":status", "200"), ("content-type", "application/grpc")]
                )
            except ProtocolError:  # reset or closed meanwhile (see flush)
                self._gone()
                return
        self.pending += b"\x00" + len(message).to_bytes(4, "big") + message
        self.flush()

    def finish(self, status: int = 0, message: str = "") -> None:
        if self.finished:
            return
        self.finished = True
        trailers = [("grpc-status", str(status))] + ([("grpc-message", message)] if message else [])
        if not self.headers_sent:  # trailers-only answer
            trailers = [(":status", "200"), ("content-type", "application/grpc"), *trailers]
            self.headers_sent = True
        self.trailers = trailers
        self.flush()

    def abort(self, status: int, message: str) -> None:
        self.finish(status, message)

    def flush(self) -> None:
        """Send what the peer's windows allow; the trailers once nothing is left."""
        h2c = self.conn.h2
        try:
            while self.pending:
                n = min(
                    len(self.pending), h2c.local_flow_control_window(self.sid), h2c.max_outbound_frame_size
                )
                if n <= 0:
                    return
                h2c.send_data(self.sid, bytes(self.pending[:n]))
                del self.pending[:n]
            if self.trailers is not None:
                h2c.send_headers(self.sid, self.trailers, end_stream=True)
                self.trailers = None
                self.conn.streams.pop(self.sid, None)
        except ProtocolError:
            # The stream was reset or closed by a frame of the same read: h2 applies a read's
            # frames before its events are handled, and may have forgotten the stream already.
            self._gone()

    def _gone(self) -> None:
        self.finished = True
        self.pending.clear()
        self.trailers = None
        self.conn.streams.pop(self.sid, None)

    def feed(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        while len(buf) >= 5:
            if buf[0] != 0:
                self.abort(12, "compressed messages are not supported")
                return
            n = int.from_bytes(buf[1:5], "big")
            if n > MAX_MESSAGE:
                self.abort(8, "message larger than the limit")
                return
            if len(buf) < 5 + n:
                return
            message = bytes(buf[5 : 5 + n])
            del buf[: 5 + n]
            if self.handler is not None and not self.finished:
                self.handler.on_message(message)


class _Budget:
    __slots__ = ("counts", "start")

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.counts = dict.fromkeys(BUDGET_PER_S, 0)

    def spend(self, what: str) -> bool:
        """Count one ``what``; False once this second's budget is exceeded."""
        now = time.monotonic()
        if now - self.start >= 1.0:
            self.start = now
            for k in self.counts:
                self.counts[k] = 0
        self.counts[what] += 1
        return self.counts[what] <= BUDGET_PER_S[what]


class H2Server(asyncio.Protocol):
    """One HTTP/2 connection serving gRPC calls through ``services``."""

    def __init__(self, services: Services, listener: Listener) -> None:
        self.services = services
        self.listener = listener
        config = H2Configuration(client_side=False, header_encoding=None)
        self.h2 = H2Connection(config=config)
        self.h2.local_settings = type(self.h2.local_settings)(
            client=False,
            initial_values={
                SettingCodes.MAX_CONCURRENT_STREAMS: listener.max_streams,
                SettingCodes.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST,
                SettingCodes.INITIAL_WINDOW_SIZE: RECV_WINDOW,
            },
        )
        self.streams: dict[int, GrpcStream] = {}
        self.budget = _Budget()
        self.transport: asyncio.Transport | None = None
        self.closed = False

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        if not self.listener.admit(self):
            transport.close()
            self.closed = True
            return
        self.h2.initiate_connection()
        self._write()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.listener.connections.discard(self)
        for s in list(self.streams.values()):
            if s.handler is not None:
                s.handler.on_reset()
        self.streams.clear()

    def pause_writing(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            events = self.h2.receive_data(data)
        except ProtocolError:  # h2 has queued a GOAWAY with the right code
            self._write()
            self._close()
            return
        for ev in events:
            if self.closed:
                return
            self._event(ev)
        self._write()

    # -- events ----------------------------------------------------------------------------
    def _event(self, ev: Any) -> None:
        if isinstance(ev, DataReceived):
            self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            s = self.streams.get(ev.stream_id)
            if s is not None:
                s.feed(ev.data)
        elif isinstance(ev, RequestReceived):
            self._request(ev)
        elif isinstance(ev, StreamEnded):
            s = self.streams.get(ev.stream_id)
            if s is not None and not s.finished:
                if s.handler is not None:
                    s.handler.on_end()
                s.finish()
        elif isinstance(ev, StreamReset):
            s = self.streams.pop(ev.stream_id, None)
            if s is not None and s.handler is not None:
                if ev.remote_reset and not s.headers_sent and not self.budget.spend("early_reset"):
                    self._calm("streams reset before their answer")
                s.handler.on_reset()
        elif isinstance(ev, WindowUpdated):
            targets = list(self.streams.values()) if ev.stream_id == 0 else [self.streams.get(ev.stream_id)]
            for s in targets:
                if s is not None:
                    s.flush()
        elif isinstance(ev, PingReceived):
            if not self.budget.spend("ping"):
                self._calm("PING flood")
        elif isinstance(ev, RemoteSettingsChanged):
            if not self.budget.spend("settings"):
                self._calm("SETTINGS flood")
        elif isinstance(ev, ConnectionTerminated):
            self._close()

    def _request(self, ev: RequestReceived) -> None:
        path = next((v for k, v in ev.headers if k == b":path"), b"")
        s = GrpcStream(self, ev.stream_id, bytes(path).decode("latin-1"))
        self.streams[ev.stream_id] = s
        s.handler = self.services(s)
        if s.handler is None:
            s.finish(12, f"unknown method {path}")

    # -- output ----------------------------------------------------------------------------
    def _write(self) -> None:
        out = self.h2.data_to_send()
        if out and self.transport is not None:
            self.transport.write(out)

    def _calm(self, why: str) -> None:
        self.h2.close_connection(error_code=ErrorCodes.ENHANCE_YOUR_CALM, additional_data=why.encode())
        self._write()
        self._close()

    def _close(self) -> None:
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.close()


class Listener:
    """Builds :class:`H2Server` connections, at most ``max_connections`` at once."""

    def __init__(self, services: Services, max_connections: int = 64, max_streams: int = MAX_STREAMS) -> None:
        self.services = services
        self.max_streams = max_streams
        self.max_connections = max_connections
        self.connections: set[H2Server] = set()

    def __call__(self) -> H2Server:
        return H2Server(self.services, self)

    def admit(self, conn: H2Server) -> bool:
        if len(self.connections) >= self.max_connections:
            return False
        self.connections.add(conn)
        return True

    def close_all(self) -> None:
        for c in list(self.connections):
            c._close()
