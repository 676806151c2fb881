"""The EPP's HTTP/2 server (:mod:`gateway.envoy.h2`) and its HPACK helpers (:mod:`gateway.envoy.hpack_cache`).

Three layers:

- a real gRPC client (``grpc.aio``, C-core's HTTP/2) against :class:`H2Connection` served on
  a loopback socket, with small test services (echo, unary, answer-later, failing ones) and
  the real ``grpc.health.v1`` client against :class:`gateway.envoy.health.HealthCheck`;
- raw frames: :class:`H2Connection` driven through a fake transport that collects what it
  writes (no socket, no waiting), the frames built and parsed here by hand;
- :mod:`gateway.envoy.hpack_cache` against the ``hpack`` package's encoder and decoder.
"""

from __future__ import annotations

import asyncio
import random
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import hpack
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.envoy import health
from gateway.envoy.h2 import H2Connection
from gateway.envoy.h2guard import Limits, Turn
from gateway.envoy.h2stream import _PART_OVERHEAD as PART_OVERHEAD
from gateway.envoy.h2stream import Stream, StreamHandler
from gateway.envoy.h2wire import (
    ACK,
    CANCEL,
    COMPRESSION_ERROR,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    MAX_CONCURRENT_STREAMS,
    MAX_FRAME_SIZE,
    NO_ERROR,
    PADDED,
    PING,
    PREFACE,
    PRIORITY,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    WINDOW_UPDATE,
)
from gateway.envoy.health import HealthCheck
from gateway.envoy.hpack_cache import HeaderDecoder, HpackError, changes_table, literal

TIMEOUT_S = 10.0
MAX_MESSAGE = 2 * 1024 * 1024
MIB = 1024 * 1024

# gRPC status codes (numbers on the wire)
GRPC_OK, GRPC_INVALID_ARGUMENT, GRPC_DEADLINE_EXCEEDED = 0, 3, 4
GRPC_RESOURCE_EXHAUSTED, GRPC_UNIMPLEMENTED, GRPC_INTERNAL = 8, 12, 13


# ======================================================================================
# Test services (shared by the gRPC client tests and the raw-frame tests)
# ======================================================================================


@dataclass
class Recorder:
    """A handler that records what happens to its stream; the test answers through ``stream``."""

    stream: Stream
    messages: list[bytes] = field(default_factory=list)
    ended: bool = False
    resets: int = 0
    awaiting: bool = True  # expire() may end it when silent

    def on_message(self, message: bytes) -> None:
        self.messages.append(message)

    def on_end(self) -> None:
        self.ended = True

    def on_reset(self) -> None:
        self.resets += 1


class Echo:
    """``/test.Echo/Chat``: echoes each message; finishes when the client half-closes."""

    awaiting = True  # expire() may end it when silent

    def __init__(self, svc: TestServices, stream: Stream) -> None:
        self.svc, self.stream = svc, stream

    def on_message(self, message: bytes) -> None:
        self.stream.send(message)
        self.svc.chat_got.set()

    def on_end(self) -> None:
        self.stream.finish()

    def on_reset(self) -> None:
        self.svc.chat_reset.set()


class Unary:
    """``/test.Echo/Unary``: answers ``b"unary:" + request`` once the request is complete."""

    awaiting = True  # expire() may end it when silent

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.request = b""

    def on_message(self, message: bytes) -> None:
        self.request = message

    def on_end(self) -> None:
        self.stream.send(b"unary:" + self.request)
        self.stream.finish()

    def on_reset(self) -> None:
        return None


class Later:
    """``/test.Echo/Later``: answers from a task, only once ``svc.release`` is set."""

    awaiting = True  # expire() may end it when silent

    def __init__(self, svc: TestServices, stream: Stream) -> None:
        self.svc, self.stream = svc, stream
        self.request = b""

    def on_message(self, message: bytes) -> None:
        self.request = message
        self.svc.later_got.set()

    def on_end(self) -> None:
        task = asyncio.get_running_loop().create_task(self._answer())
        self.svc.tasks.add(task)
        task.add_done_callback(self.svc.tasks.discard)

    async def _answer(self) -> None:
        await self.svc.release.wait()
        self.stream.send(b"later:" + self.request)
        self.stream.finish()

    def on_reset(self) -> None:
        return None


class Boom:
    """``/test.Echo/Boom``: raises on every message."""

    awaiting = True  # expire() may end it when silent

    def __init__(self, svc: TestServices) -> None:
        self.svc = svc

    def on_message(self, message: bytes) -> None:
        raise RuntimeError("a handler bug")

    def on_end(self) -> None:
        return None

    def on_reset(self) -> None:
        self.svc.boom_reset.set()


class Fail:
    """``/test.Echo/Fail``: the request is ``b"<code>|<details>"``; finishes with that status."""

    awaiting = True  # expire() may end it when silent

    def __init__(self, stream: Stream) -> None:
        self.stream = stream

    def on_message(self, message: bytes) -> None:
        code, _, details = message.decode().partition("|")
        self.stream.finish(int(code), details)

    def on_end(self) -> None:
        return None

    def on_reset(self) -> None:
        return None


class TestServices:
    """The ``services`` callable of the tests: a handler per path, None for unknown ones."""

    __test__ = False  # not a pytest test class

    def __init__(self) -> None:
        self.ready = True
        self.chat_got = asyncio.Event()
        self.chat_reset = asyncio.Event()
        self.later_got = asyncio.Event()
        self.release = asyncio.Event()
        self.boom_reset = asyncio.Event()
        self.tasks: set[asyncio.Task[None]] = set()
        self.recorders: dict[int, Recorder] = {}  # stream id -> handler, for /test.Raw/Record

    def __call__(self, stream: Stream) -> StreamHandler | None:
        path = stream.path
        if path == "/test.Echo/Chat":
            return Echo(self, stream)
        if path == "/test.Echo/Unary":
            return Unary(stream)
        if path == "/test.Echo/Later":
            return Later(self, stream)
        if path == "/test.Echo/Boom":
            return Boom(self)
        if path == "/test.Echo/Fail":
            return Fail(stream)
        if path == "/test.Raw/Record":
            rec = self.recorders[stream.id] = Recorder(stream)
            return rec
        if path == health.PATH:
            return HealthCheck(stream, lambda: self.ready)
        return None


# ======================================================================================
# A real gRPC client
# ======================================================================================


@dataclass
class GrpcServer:
    channel: grpc.aio.Channel
    svc: TestServices
    conns: list[H2Connection]
    target: str

    def stream_stream(self, path: str) -> Any:
        return self.channel.stream_stream(path, request_serializer=None, response_deserializer=None)

    def unary_unary(self, path: str) -> Any:
        return self.channel.unary_unary(path, request_serializer=None, response_deserializer=None)


@pytest.fixture
async def served() -> AsyncIterator[GrpcServer]:
    svc = TestServices()
    conns: list[H2Connection] = []

    def connection() -> H2Connection:
        conn = H2Connection(svc, max_message=MAX_MESSAGE)
        conns.append(conn)
        return conn

    server = await asyncio.get_running_loop().create_server(connection, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield GrpcServer(channel, svc, conns, f"127.0.0.1:{port}")
    finally:
        await channel.close()
        server.close()
        for conn in conns:
            conn.close()
        await server.wait_closed()
        for task in list(svc.tasks):
            task.cancel()


async def test_grpc_bidi_several_messages_each_way(served: GrpcServer) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        call = served.stream_stream("/test.Echo/Chat")()
        for i in range(5):
            await call.write(b"message %d" % i)
            assert await call.read() == b"message %d" % i
        # several written before any is read: answered in order
        for i in range(5, 10):
            await call.write(b"message %d" % i)
        for i in range(5, 10):
            assert await call.read() == b"message %d" % i
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        assert await call.code() == grpc.StatusCode.OK


async def test_grpc_empty_message_and_unary(served: GrpcServer) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        assert await served.unary_unary("/test.Echo/Unary")(b"hello") == b"unary:hello"
        assert await served.unary_unary("/test.Echo/Unary")(b"") == b"unary:"
        call = served.stream_stream("/test.Echo/Chat")()
        await call.write(b"")
        assert await call.read() == b""
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK


async def test_grpc_200_concurrent_streams_on_one_channel(served: GrpcServer) -> None:
    unary = served.unary_unary("/test.Echo/Unary")
    chat = served.stream_stream("/test.Echo/Chat")

    opened: list[int] = []
    all_open = asyncio.Event()

    async def one_chat(i: int) -> None:
        call = chat()
        for j in range(3):
            await call.write(b"%d.%d" % (i, j))
            assert await call.read() == b"%d.%d" % (i, j)
            if j == 0:  # every stream waits here until all 200 are open at once
                opened.append(i)
                if len(opened) == 200:
                    assert len(served.conns[0].streams) == 200
                    all_open.set()
                await all_open.wait()
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK

    async with asyncio.timeout(TIMEOUT_S * 2):
        answers = await asyncio.gather(*(unary(b"req %d" % i) for i in range(200)))
        assert answers == [b"unary:req %d" % i for i in range(200)]
        await asyncio.gather(*(one_chat(i) for i in range(200)))
    assert len(served.conns) == 1  # all of them on one HTTP/2 connection
    assert not served.conns[0].streams  # and none left behind


async def test_grpc_one_mib_message_both_ways(served: GrpcServer) -> None:
    big = random.Random(1).randbytes(MIB)
    async with asyncio.timeout(TIMEOUT_S):
        call = served.stream_stream("/test.Echo/Chat")()
        await call.write(big)
        assert await call.read() == big
        await call.write(big[::-1])
        assert await call.read() == big[::-1]
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK
        assert await served.unary_unary("/test.Echo/Unary")(big) == b"unary:" + big


async def test_grpc_one_mib_message_with_the_default_64_kib_windows(served: GrpcServer) -> None:
    """With BDP probing off, C-core keeps HTTP/2's 64 KiB windows and grants more only as the
    data arrives: a 1 MiB answer must go out in parts as the window allows (it once waited
    for a window as large as the whole message, forever)."""
    big = random.Random(2).randbytes(MIB)
    channel = grpc.aio.insecure_channel(served.target, options=[("grpc.http2.bdp_probe", 0)])
    try:
        async with asyncio.timeout(TIMEOUT_S):
            call = channel.stream_stream(
                "/test.Echo/Chat", request_serializer=None, response_deserializer=None
            )()
            await call.write(big)
            assert await call.read() == big
            await call.done_writing()
            assert await call.code() == grpc.StatusCode.OK
    finally:
        await channel.close()
    assert any(conn.peer_initial_window == 65_535 for conn in served.conns)  # the premise


async def test_grpc_unknown_method_is_unimplemented(served: GrpcServer) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await served.unary_unary("/test.Echo/Nope")(b"x")
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "/test.Echo/Nope" in (err.value.details() or "")
        # the connection still serves
        assert await served.unary_unary("/test.Echo/Unary")(b"x") == b"unary:x"


async def test_grpc_message_over_max_message_is_resource_exhausted(served: GrpcServer) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await served.unary_unary("/test.Echo/Unary")(b"x" * (MAX_MESSAGE + 1))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # exactly the limit passes
        answer = await served.unary_unary("/test.Echo/Unary")(b"y" * MAX_MESSAGE)
        assert answer == b"unary:" + b"y" * MAX_MESSAGE


async def test_grpc_handler_raising_is_internal_and_connection_serves_on(served: GrpcServer) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        chat = served.stream_stream("/test.Echo/Chat")()
        await chat.write(b"before")
        assert await chat.read() == b"before"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await served.unary_unary("/test.Echo/Boom")(b"x")
        assert err.value.code() == grpc.StatusCode.INTERNAL
        await served.svc.boom_reset.wait()  # the failed handler is told its stream is gone
        # the stream opened before still works, and new ones too
        await chat.write(b"after")
        assert await chat.read() == b"after"
        await chat.done_writing()
        assert await chat.code() == grpc.StatusCode.OK
        assert await served.unary_unary("/test.Echo/Unary")(b"x") == b"unary:x"
    assert len(served.conns) == 1


async def test_grpc_client_cancel_resets_the_handler(served: GrpcServer) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        call = served.stream_stream("/test.Echo/Chat")()
        await call.write(b"hi")
        assert await call.read() == b"hi"
        assert not served.svc.chat_reset.is_set()
        call.cancel()
        await served.svc.chat_reset.wait()
        assert await call.code() == grpc.StatusCode.CANCELLED
        conn = served.conns[0]
        assert not conn.streams
        assert await served.unary_unary("/test.Echo/Unary")(b"x") == b"unary:x"


async def test_grpc_answer_from_a_task_after_an_event(served: GrpcServer) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        call = served.unary_unary("/test.Echo/Later")(b"q")
        answer = asyncio.ensure_future(call)
        await served.svc.later_got.wait()
        assert not answer.done()
        served.svc.release.set()
        assert await answer == b"later:q"


@pytest.mark.parametrize(
    ("code", "details"),
    [
        (grpc.StatusCode.FAILED_PRECONDITION, "not ready: try again later"),
        (grpc.StatusCode.INVALID_ARGUMENT, 'bad input — café ☕ 100% «quoted» "x" <y> {z} a\\b'),
        (grpc.StatusCode.UNAVAILABLE, ""),
    ],
)
async def test_grpc_finish_with_status_and_message(
    served: GrpcServer, code: grpc.StatusCode, details: str
) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await served.unary_unary("/test.Echo/Fail")(f"{code.value[0]}|{details}".encode())
        assert err.value.code() == code
        assert (err.value.details() or "") == details


async def test_grpc_health_check(served: GrpcServer) -> None:
    stub = health_pb2_grpc.HealthStub(served.channel)
    serving = health_pb2.HealthCheckResponse.SERVING
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    async with asyncio.timeout(TIMEOUT_S):
        for name in ("", health.READINESS, health.EXT_PROC, health.LIVENESS):
            answer = await stub.Check(health_pb2.HealthCheckRequest(service=name))
            assert answer.status == serving, name
        served.svc.ready = False
        for name in ("", health.READINESS, health.EXT_PROC):
            answer = await stub.Check(health_pb2.HealthCheckRequest(service=name))
            assert answer.status == not_serving, name
        answer = await stub.Check(health_pb2.HealthCheckRequest(service=health.LIVENESS))
        assert answer.status == serving
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        served.svc.ready = True
        answer = await stub.Check(health_pb2.HealthCheckRequest(service=health.READINESS))
        assert answer.status == serving


# ======================================================================================
# Raw frames through a fake transport
# ======================================================================================


@dataclass
class Frame:
    kind: int
    flags: int
    sid: int
    payload: bytes


def frame(kind: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return struct.pack(">BHBBI", n >> 16, n & 0xFFFF, kind, flags, sid) + payload


def parse_frames(data: bytes) -> list[Frame]:
    out, pos = [], 0
    while pos < len(data):
        assert len(data) - pos >= 9, "a truncated frame header"
        hi, lo, kind, flags, sid = struct.unpack_from(">BHBBI", data, pos)
        length = hi << 16 | lo
        assert len(data) - pos - 9 >= length, "a truncated frame"
        out.append(Frame(kind, flags, sid & 0x7FFFFFFF, data[pos + 9 : pos + 9 + length]))
        pos += 9 + length
    return out


def settings(pairs: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in pairs.items()))


def grpc_message(body: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(body)) + body


def u32(n: int) -> bytes:
    return struct.pack(">I", n)


class FakeTransport:
    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False
        self.paused = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "a write after close"
        self.data += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


class Peer:
    """The client side of one :class:`H2Connection`, frame by frame."""

    def __init__(self, **kwargs: Any) -> None:
        self.svc = TestServices()
        self.transport = FakeTransport()
        # the frames sent here come without turns of the loop between them: the shared turn's
        # budget is the tests' of it to set (the slice of one connection still applies)
        kwargs.setdefault("turn", Turn(60.0))
        self.conn = H2Connection(self.svc, **kwargs)
        self.conn.connection_made(self.transport)  # type: ignore[arg-type]
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self._seen = 0
        first = self.frames()
        assert [f.kind for f in first] == [SETTINGS, WINDOW_UPDATE]  # the server speaks first
        self.server_settings = dict(struct.iter_unpack(">HI", first[0].payload))

    def send(self, *frames: bytes) -> None:
        self.conn.data_received(b"".join(frames))

    def frames(self) -> list[Frame]:
        """The frames the server wrote since the last call."""
        data = bytes(self.transport.data[self._seen :])
        self._seen = len(self.transport.data)
        return parse_frames(data)

    def start(self, pairs: dict[int, int] | None = None) -> None:
        self.send(PREFACE, settings(pairs or {}))
        assert self.frames() == [Frame(SETTINGS, ACK, 0, b"")]

    def headers_block(self, path: str, extra: list[tuple[str, str]] | None = None) -> bytes:
        fields = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", "epp"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            *(extra or []),
        ]
        return bytes(self.encoder.encode(fields))

    def open(self, sid: int, path: str = "/test.Raw/Record", *, end_stream: bool = False) -> bytes:
        flags = END_HEADERS | (END_STREAM if end_stream else 0)
        return frame(HEADERS, flags, sid, self.headers_block(path))

    def decode(self, f: Frame) -> dict[str, str]:
        assert f.kind == HEADERS
        return {str(k): str(v) for k, v in self.decoder.decode(f.payload, raw=False)}

    def goaway(self) -> tuple[int, int]:
        """The (last stream id, error code) of the GOAWAY the server sent, which closed it."""
        frames = self.frames()
        assert frames and frames[-1].kind == GOAWAY, frames
        assert self.transport.closed
        last, code = struct.unpack(">II", frames[-1].payload[:8])
        return last & 0x7FFFFFFF, code


def data_of(frames: list[Frame], sid: int) -> bytes:
    return b"".join(f.payload for f in frames if f.kind == DATA and f.sid == sid)


def trailers_of(frames: list[Frame], sid: int) -> Frame:
    """The stream's trailers (HEADERS with END_STREAM), checked to come after all its DATA and
    to be followed by nothing on the stream but RST_STREAM(NO_ERROR)."""
    on_stream = [f for f in frames if f.sid == sid]
    ends = [i for i, f in enumerate(on_stream) if f.kind == HEADERS and f.flags & END_STREAM]
    assert len(ends) == 1, on_stream
    assert all(f == Frame(RST_STREAM, 0, sid, u32(NO_ERROR)) for f in on_stream[ends[0] + 1 :]), on_stream
    return on_stream[ends[0]]


async def test_raw_server_settings() -> None:
    peer = Peer(max_streams=7)
    assert peer.server_settings[MAX_CONCURRENT_STREAMS] == 7
    assert peer.server_settings[INITIAL_WINDOW_SIZE] >= 1 << 20


async def test_raw_bad_preface_is_protocol_error() -> None:
    peer = Peer()
    peer.send(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert peer.goaway() == (0, PROTOCOL_ERROR)


async def test_raw_bad_preface_detected_before_it_is_complete() -> None:
    peer = Peer()
    peer.send(PREFACE[:10])  # a prefix of the preface: wait for more
    assert not peer.frames() and not peer.transport.closed
    peer.send(b"XX")
    assert peer.goaway() == (0, PROTOCOL_ERROR)


async def test_raw_preface_and_frames_byte_by_byte() -> None:
    """Everything the client sends, one byte per ``data_received``: assembled all the same."""
    peer = Peer()
    wire = PREFACE + settings({}) + peer.open(1) + frame(DATA, END_STREAM, 1, grpc_message(b"slow"))
    for i in range(len(wire)):
        peer.conn.data_received(wire[i : i + 1])
    rec = peer.svc.recorders[1]
    assert rec.messages == [b"slow"] and rec.ended
    assert peer.frames() == [Frame(SETTINGS, ACK, 0, b"")]


async def test_raw_ping_is_answered_with_the_same_payload() -> None:
    peer = Peer()
    peer.start()
    peer.send(frame(PING, 0, 0, b"12345678"))
    assert peer.frames() == [Frame(PING, ACK, 0, b"12345678")]
    peer.send(frame(PING, ACK, 0, b"87654321"))  # an ACK is not answered
    assert peer.frames() == []
    peer.send(frame(PING, 0, 0, b"short"))
    assert peer.goaway()[1] == PROTOCOL_ERROR


async def test_raw_settings_are_acknowledged_and_acks_are_not() -> None:
    peer = Peer()
    peer.start({INITIAL_WINDOW_SIZE: 1000})
    peer.send(settings({INITIAL_WINDOW_SIZE: 2000}))
    assert peer.frames() == [Frame(SETTINGS, ACK, 0, b"")]
    peer.send(frame(SETTINGS, ACK, 0))
    assert peer.frames() == []
    assert peer.conn.peer_initial_window == 2000


async def test_raw_frame_larger_than_16384_is_frame_size_error() -> None:
    peer = Peer()
    peer.start()
    peer.send(frame(PING, 0, 0, b"x" * 16_385))
    assert peer.goaway()[1] == FRAME_SIZE_ERROR


async def test_raw_oversized_frame_in_parts_is_refused_once_its_header_is_in() -> None:
    """A frame kept across reads (the rest of it not come yet) is still judged by its
    header as soon as that is whole: no waiting for a payload too large to take."""
    peer = Peer()
    peer.start()
    wire = frame(PING, 0, 0, b"x" * 16_385)
    peer.send(wire[:4])
    assert not peer.transport.closed
    peer.send(wire[4:9])
    assert peer.goaway()[1] == FRAME_SIZE_ERROR


async def test_raw_frames_split_anywhere_between_reads() -> None:
    """Reads that end inside a frame header, inside a payload, or on a boundary, with the
    next frame's start in the same read: every message arrives once, in order."""
    wire = b"".join(
        frame(DATA, END_STREAM if i == 4 else 0, 1, grpc_message(b"m%d" % i + b"x" * (i * 50)))
        for i in range(5)
    )
    for cut in (1, 5, 9, 10, 33, 120):
        peer = Peer()
        peer.start()
        peer.send(peer.open(1))
        for i in range(0, len(wire), cut):
            peer.send(wire[i : i + cut])
        rec = peer.svc.recorders[1]
        assert rec.messages == [b"m%d" % i + b"x" * (i * 50) for i in range(5)], cut
        assert rec.ended


async def test_raw_frame_of_16384_is_fine() -> None:
    peer = Peer()
    peer.start()
    peer.send(peer.open(1), frame(DATA, 0, 1, b"\x00" * 16_384))
    assert not peer.transport.closed
    assert peer.frames() == []


async def test_raw_undecodable_header_block_is_compression_error() -> None:
    peer = Peer()
    peer.start()
    # an indexed field pointing past the static table, with an empty dynamic table
    peer.send(frame(HEADERS, END_HEADERS, 1, bytes([0x80 | 70])))
    assert peer.goaway() == (0, COMPRESSION_ERROR)


async def test_raw_truncated_header_block_is_compression_error() -> None:
    peer = Peer()
    peer.start()
    block = peer.headers_block("/test.Raw/Record")
    peer.send(frame(HEADERS, END_HEADERS, 1, block[:-3]))
    assert peer.goaway()[1] == COMPRESSION_ERROR


async def test_raw_continuation_frames_are_assembled() -> None:
    peer = Peer()
    peer.start()
    block = peer.headers_block("/test.Raw/Record", [("x-long", "v" * 300), ("x-other", "o")])
    a, b, c = block[:10], block[10:100], block[100:]
    peer.send(
        frame(HEADERS, 0, 1, a),
        frame(CONTINUATION, 0, 1, b),
        frame(CONTINUATION, END_HEADERS, 1, c),
        frame(DATA, END_STREAM, 1, grpc_message(b"m")),
    )
    rec = peer.svc.recorders[1]
    assert rec.stream.header("x-long") == "v" * 300
    assert rec.stream.header("x-other") == "o"
    assert rec.messages == [b"m"] and rec.ended
    assert not peer.transport.closed


async def test_raw_end_stream_on_headers_followed_by_continuation() -> None:
    """END_STREAM on a HEADERS frame whose block ends in a CONTINUATION still ends the stream."""
    peer = Peer()
    peer.start()
    block = peer.headers_block("/test.Echo/Unary")
    peer.send(frame(HEADERS, END_STREAM, 1, block[:5]), frame(CONTINUATION, END_HEADERS, 1, block[5:]))
    frames = peer.frames()
    assert [f.kind for f in frames] == [HEADERS, DATA, HEADERS]
    assert data_of(frames, 1) == grpc_message(b"unary:")
    assert peer.decode(frames[2])["grpc-status"] == "0"


async def test_raw_header_block_interrupted_is_protocol_error() -> None:
    peer = Peer()
    peer.start()
    block = peer.headers_block("/test.Raw/Record")
    peer.send(frame(HEADERS, 0, 1, block[:5]), frame(PING, 0, 0, b"12345678"))
    assert peer.goaway()[1] == PROTOCOL_ERROR
    assert not peer.svc.recorders


async def test_raw_continuation_on_another_stream_is_protocol_error() -> None:
    peer = Peer()
    peer.start()
    block = peer.headers_block("/test.Raw/Record")
    peer.send(frame(HEADERS, 0, 1, block[:5]), frame(CONTINUATION, END_HEADERS, 3, block[5:]))
    assert peer.goaway()[1] == PROTOCOL_ERROR


async def test_raw_continuation_without_headers_is_protocol_error() -> None:
    peer = Peer()
    peer.start()
    peer.send(frame(CONTINUATION, END_HEADERS, 1, b"\x82"))
    assert peer.goaway()[1] == PROTOCOL_ERROR


async def test_raw_headers_on_even_stream_is_protocol_error() -> None:
    peer = Peer()
    peer.start()
    peer.send(peer.open(2))
    assert peer.goaway()[1] == PROTOCOL_ERROR


async def test_raw_data_on_idle_stream_is_protocol_error() -> None:
    peer = Peer()
    peer.start()
    peer.send(frame(DATA, 0, 5, grpc_message(b"x")))
    assert peer.goaway()[1] == PROTOCOL_ERROR


@pytest.mark.parametrize(
    ("wire", "code"),
    [
        (settings({INITIAL_WINDOW_SIZE: 1 << 31}), FLOW_CONTROL_ERROR),
        (settings({MAX_FRAME_SIZE: 1000}), PROTOCOL_ERROR),
        (frame(SETTINGS, 0, 0, b"\x00\x04\x00"), FRAME_SIZE_ERROR),
        (frame(SETTINGS, 0, 1, b""), PROTOCOL_ERROR),
        (frame(WINDOW_UPDATE, 0, 0, u32(0)), PROTOCOL_ERROR),
        (frame(WINDOW_UPDATE, 0, 0, u32((1 << 31) - 1)), FLOW_CONTROL_ERROR),
        (frame(WINDOW_UPDATE, 0, 0, b"\x00"), FRAME_SIZE_ERROR),
        (frame(PUSH_PROMISE, END_HEADERS, 1, u32(2) + b"\x82"), PROTOCOL_ERROR),
        (frame(PRIORITY, 0, 0, u32(0) + b"\x10"), PROTOCOL_ERROR),
        (frame(RST_STREAM, 0, 0, u32(CANCEL)), PROTOCOL_ERROR),
        (frame(DATA, 0, 0, grpc_message(b"x")), PROTOCOL_ERROR),
    ],
)
async def test_raw_connection_errors(wire: bytes, code: int) -> None:
    peer = Peer()
    peer.start()
    peer.send(wire)
    assert peer.goaway() == (0, code)


async def test_raw_unknown_frame_types_are_ignored() -> None:
    peer = Peer()
    peer.start()
    peer.send(frame(0xFA, 0xFF, 1, b"whatever"), peer.open(1), frame(0x10, 0, 0, b""))
    peer.send(frame(DATA, END_STREAM, 1, grpc_message(b"m")))
    assert peer.svc.recorders[1].messages == [b"m"] and not peer.transport.closed


async def test_raw_client_trailers_end_the_stream() -> None:
    peer = Peer()
    peer.start()
    peer.send(peer.open(1), frame(DATA, 0, 1, grpc_message(b"m")))
    block = peer.encoder.encode([("x-trailer", "t")])
    peer.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, bytes(block)))
    rec = peer.svc.recorders[1]
    assert rec.messages == [b"m"] and rec.ended
    rec.stream.finish()
    (f,) = peer.frames()  # trailers, no RST_STREAM: both sides are done
    assert f.kind == HEADERS and f.flags & END_STREAM
    assert peer.conn.streams == {}


async def test_raw_receive_window_is_granted_again_as_messages_are_consumed() -> None:
    """The windows are refilled for whole messages handed on (a quarter of the window at a
    time: the stream's here, the connection's being larger), never for a message in parts."""
    peer = Peer(max_message=400, limits=Limits(connection_window=66_535, stream_window=1000))
    peer.start()
    peer.send(peer.open(1), frame(DATA, 0, 1, grpc_message(b"x" * 200)))
    assert peer.frames() == []  # 205 bytes consumed: under a quarter of the window
    peer.send(frame(DATA, 0, 1, grpc_message(b"y" * 100)))
    assert peer.frames() == [Frame(WINDOW_UPDATE, 0, 1, u32(310))]
    peer.send(frame(DATA, 0, 1, grpc_message(b"z" * 300)[:300]))  # all but the last 5 bytes
    assert peer.frames() == []  # kept, not consumed: no window for it
    assert peer.conn.mem == 300 + PART_OVERHEAD  # its bytes and the one part holding them
    peer.send(frame(DATA, 0, 1, grpc_message(b"z" * 300)[300:]))
    assert peer.frames() == [Frame(WINDOW_UPDATE, 0, 1, u32(305))]
    assert peer.conn.mem == 0
    assert peer.svc.recorders[1].messages == [b"x" * 200, b"y" * 100, b"z" * 300]


async def test_raw_streams_over_max_streams_are_refused() -> None:
    peer = Peer(max_streams=2)
    peer.start()
    peer.send(peer.open(1), peer.open(3), peer.open(5))
    assert peer.frames() == [Frame(RST_STREAM, 0, 5, u32(REFUSED_STREAM))]
    assert sorted(peer.svc.recorders) == [1, 3]
    # DATA the client sent on the refused stream before it saw the reset: dropped, no error
    peer.send(frame(DATA, END_STREAM, 5, grpc_message(b"late")))
    assert not peer.transport.closed
    # once a stream ends, there is room again
    peer.svc.recorders[1].stream.finish()
    frames = peer.frames()
    assert frames[0].kind == HEADERS and frames[0].sid == 1 and frames[0].flags & END_STREAM
    peer.send(peer.open(7))
    assert sorted(peer.svc.recorders) == [1, 3, 7]


async def test_raw_unknown_method_and_non_grpc_requests() -> None:
    peer = Peer()
    peer.start()
    peer.send(peer.open(1, "/test.Raw/Nope", end_stream=True))
    (f,) = peer.frames()
    assert f.kind == HEADERS and f.flags & END_STREAM
    fields = peer.decode(f)
    assert fields[":status"] == "200" and fields["content-type"] == "application/grpc"
    assert fields["grpc-status"] == str(GRPC_UNIMPLEMENTED)
    # a GET: not gRPC
    block = peer.encoder.encode([(":method", "GET"), (":path", "/test.Raw/Record"), (":scheme", "http")])
    peer.send(frame(HEADERS, END_HEADERS | END_STREAM, 3, bytes(block)))
    (f,) = peer.frames()
    assert peer.decode(f)["grpc-status"] == str(GRPC_INVALID_ARGUMENT)
    assert not peer.svc.recorders


async def test_raw_messages_split_and_joined_across_data_frames() -> None:
    peer = Peer()
    peer.start()
    wire = grpc_message(b"one") + grpc_message(b"") + grpc_message(b"three" * 1000)
    peer.send(peer.open(1))
    for i in range(0, len(wire), 7):
        peer.send(frame(DATA, 0, 1, wire[i : i + 7]))
    peer.send(frame(DATA, END_STREAM, 1, grpc_message(b"four") + grpc_message(b"five")))
    rec = peer.svc.recorders[1]
    assert rec.messages == [b"one", b"", b"three" * 1000, b"four", b"five"]
    assert rec.ended


async def test_raw_padded_data_and_headers_are_unpadded() -> None:
    peer = Peer()
    peer.start()
    block = peer.headers_block("/test.Raw/Record")
    # HEADERS with PADDED and PRIORITY: pad length, priority fields, block, padding
    priority = u32(0) + b"\x10"
    peer.send(frame(HEADERS, END_HEADERS | PADDED | PRIORITY_FLAG, 1, b"\x04" + priority + block + b"\0" * 4))
    msg = grpc_message(b"payload")
    peer.send(frame(DATA, PADDED, 1, b"\x07" + msg + b"\0" * 7))
    peer.send(frame(DATA, PADDED | END_STREAM, 1, b"\x00" + grpc_message(b"no padding")))
    rec = peer.svc.recorders[1]
    assert rec.stream.path == "/test.Raw/Record"
    assert rec.messages == [b"payload", b"no padding"] and rec.ended
    # a PRIORITY frame is ignored
    peer.send(frame(PRIORITY, 0, 1, priority))
    assert not peer.transport.closed


async def test_raw_padding_longer_than_the_frame_is_protocol_error() -> None:
    peer = Peer()
    peer.start()
    peer.send(peer.open(1), frame(DATA, PADDED, 1, b"\x05abc"))
    assert peer.goaway()[1] == PROTOCOL_ERROR


async def test_raw_flow_control_waits_for_the_stream_window() -> None:
    peer = Peer()
    peer.start({INITIAL_WINDOW_SIZE: 10})
    peer.send(peer.open(1))
    stream = peer.svc.recorders[1].stream
    first, second = b"abcdefghijklmnopqrst", b"0123456789"
    stream.send(first)
    stream.send(second)
    stream.finish()
    frames = peer.frames()
    assert frames[0].kind == HEADERS and not frames[0].flags & END_STREAM
    assert len(data_of(frames, 1)) <= 10  # nothing beyond the window
    assert all(f.kind != HEADERS for f in frames[1:])  # the trailers wait behind the data
    written = data_of(frames, 1)

    peer.send(frame(WINDOW_UPDATE, 0, 1, u32(10)))  # still not enough for the rest
    frames = peer.frames()
    written += data_of(frames, 1)
    assert len(written) <= 20
    assert all(f.kind == DATA for f in frames)

    peer.send(frame(WINDOW_UPDATE, 0, 1, u32(1000)))
    frames = peer.frames()
    written += data_of(frames, 1)
    assert written == grpc_message(first) + grpc_message(second)  # in order
    assert peer.decode(trailers_of(frames, 1))["grpc-status"] == "0"  # trailers last
    assert peer.conn.streams == {}


async def test_raw_flow_control_sends_as_much_as_the_window_allows() -> None:
    """A message larger than the window is sent in parts: a peer that grants more window only
    as it receives data (as gRPC C-core and Envoy do) must not wait forever."""
    peer = Peer()
    peer.start({INITIAL_WINDOW_SIZE: 10})
    peer.send(peer.open(1))
    stream = peer.svc.recorders[1].stream
    stream.send(b"x" * 100)
    stream.finish()
    written = data_of(peer.frames(), 1)
    assert len(written) == 10
    for _ in range(20):
        if len(written) == 105:
            break
        peer.send(frame(WINDOW_UPDATE, 0, 1, u32(len(written) and 10)))  # grant what was received
        frames = peer.frames()
        written += data_of(frames, 1)
    assert written == grpc_message(b"x" * 100)
    trailers_of(frames, 1)


async def test_raw_flow_control_waits_for_the_connection_window() -> None:
    peer = Peer()
    peer.start({INITIAL_WINDOW_SIZE: 1 << 20})  # streams may take a lot; the connection 65535
    peer.send(peer.open(1), peer.open(3))
    s1, s3 = peer.svc.recorders[1].stream, peer.svc.recorders[3].stream
    s1.send(b"a" * 60_000)
    s3.send(b"b" * 10_000)
    s3.finish()
    frames = peer.frames()
    assert len(data_of(frames, 1)) + len(data_of(frames, 3)) <= 65_535
    assert data_of(frames, 1) == grpc_message(b"a" * 60_000)
    assert not any(f.kind == HEADERS and f.sid == 3 and f.flags & END_STREAM for f in frames)
    written3 = data_of(frames, 3)
    # a stream's WINDOW_UPDATE does not help: the connection's window is spent
    peer.send(frame(WINDOW_UPDATE, 0, 3, u32(100_000)))
    frames = peer.frames()
    assert data_of(frames, 3) == b""
    peer.send(frame(WINDOW_UPDATE, 0, 0, u32(100_000)))
    frames = peer.frames()
    written3 += data_of(frames, 3)
    assert written3 == grpc_message(b"b" * 10_000)
    trailers_of(frames, 3)


async def test_raw_settings_raising_the_window_releases_what_waits() -> None:
    peer = Peer()
    peer.start({INITIAL_WINDOW_SIZE: 0})
    peer.send(peer.open(1))
    stream = peer.svc.recorders[1].stream
    stream.send(b"hello")
    stream.finish()
    assert data_of(peer.frames(), 1) == b""
    peer.send(settings({INITIAL_WINDOW_SIZE: 65_535}))
    frames = peer.frames()
    assert frames[0] == Frame(SETTINGS, ACK, 0, b"")
    assert data_of(frames, 1) == grpc_message(b"hello")
    trailers_of(frames, 1)


async def test_raw_response_waiting_for_window_survives_the_peer_half_close() -> None:
    """The handler finished with its answer still waiting for window, then the client
    half-closed: the answer and trailers still go out when the window opens."""
    peer = Peer()
    peer.start({INITIAL_WINDOW_SIZE: 0})
    peer.send(peer.open(1))
    rec = peer.svc.recorders[1]
    rec.stream.send(b"answer")
    rec.stream.finish()
    peer.send(frame(DATA, END_STREAM, 1, b""))
    assert data_of(peer.frames(), 1) == b""
    peer.send(frame(WINDOW_UPDATE, 0, 1, u32(1000)))
    frames = peer.frames()
    assert data_of(frames, 1) == grpc_message(b"answer")
    assert trailers_of(frames, 1) == frames[-1]  # the client half-closed: no RST_STREAM
    assert peer.conn.streams == {}


async def test_raw_no_on_reset_after_finish_while_the_trailers_wait() -> None:
    """:meth:`StreamHandler.on_reset` is not called after :meth:`Stream.finish`, even when the
    trailers still wait for window and the stream then expires or is reset."""
    peer = Peer()
    peer.start({INITIAL_WINDOW_SIZE: 0})
    peer.send(peer.open(1))
    rec = peer.svc.recorders[1]
    rec.stream.send(b"answer")
    rec.stream.finish()
    peer.conn.expire(rec.stream.last_activity + 100, 10)
    assert rec.resets == 0
    assert [f.kind for f in peer.frames()] == [HEADERS]  # the response headers, nothing more
    peer.send(frame(RST_STREAM, 0, 1, u32(CANCEL)))
    assert rec.resets == 0 and peer.conn.streams == {}
    peer.conn.connection_lost(None)
    assert rec.resets == 0


async def test_raw_large_response_is_split_into_max_frame_size_frames() -> None:
    peer = Peer()
    peer.start()
    peer.send(peer.open(1))
    peer.svc.recorders[1].stream.send(b"z" * 40_000)
    frames = [f for f in peer.frames() if f.kind == DATA]
    assert len(frames) == 3 and all(len(f.payload) <= 16_384 for f in frames)
    assert b"".join(f.payload for f in frames) == grpc_message(b"z" * 40_000)


async def test_raw_rst_stream_from_the_peer_resets_the_handler() -> None:
    peer = Peer()
    peer.start()
    peer.send(peer.open(1), frame(DATA, 0, 1, grpc_message(b"m")))
    rec = peer.svc.recorders[1]
    peer.send(frame(RST_STREAM, 0, 1, u32(CANCEL)))
    assert rec.resets == 1
    assert peer.conn.streams == {}
    rec.stream.send(b"too late")  # dropped, no error
    rec.stream.finish()
    assert peer.frames() == []
    # DATA the peer had in flight on the reset stream: dropped
    peer.send(frame(DATA, END_STREAM, 1, grpc_message(b"in flight")))
    assert rec.messages == [b"m"] and not peer.transport.closed
    assert rec.resets == 1


async def test_raw_goaway_from_the_peer_closes_when_streams_end() -> None:
    peer = Peer()
    peer.start()
    peer.send(peer.open(1), peer.open(3))
    peer.send(frame(GOAWAY, 0, 0, u32(0) + u32(NO_ERROR)))
    assert not peer.transport.closed
    peer.send(peer.open(5))  # no new streams
    assert peer.frames() == [Frame(RST_STREAM, 0, 5, u32(REFUSED_STREAM))]
    assert sorted(peer.svc.recorders) == [1, 3]
    peer.svc.recorders[1].stream.finish()
    assert not peer.transport.closed
    peer.send(frame(DATA, END_STREAM, 3, grpc_message(b"last")))
    rec3 = peer.svc.recorders[3]
    assert rec3.messages == [b"last"]
    rec3.stream.send(b"bye")
    rec3.stream.finish()
    assert peer.transport.closed
    frames = peer.frames()
    assert data_of(frames, 3) == grpc_message(b"bye")
    assert trailers_of(frames, 3) == frames[-1]


async def test_raw_goaway_from_the_peer_when_idle_closes_at_once() -> None:
    peer = Peer()
    peer.start()
    peer.send(frame(GOAWAY, 0, 0, u32(0) + u32(NO_ERROR)))
    assert peer.transport.closed


async def test_raw_shutdown_goes_away_and_closes_when_streams_end() -> None:
    peer = Peer()
    peer.start()
    peer.send(peer.open(1))
    peer.conn.shutdown()
    (f,) = peer.frames()
    assert f.kind == GOAWAY and struct.unpack(">I", f.payload[4:8])[0] == NO_ERROR
    assert not peer.transport.closed
    peer.svc.recorders[1].stream.finish()
    assert peer.transport.closed


async def test_raw_expire_ends_silent_streams_with_deadline_exceeded() -> None:
    peer = Peer()
    peer.start()
    peer.send(peer.open(1), peer.open(3))
    s1, s3 = peer.conn.streams[1], peer.conn.streams[3]
    now = max(s1.last_activity, s3.last_activity) + 5
    peer.conn.expire(now, 10)  # nobody silent for 10 s yet
    assert peer.frames() == [] and len(peer.conn.streams) == 2
    s3.last_activity = now + 25  # stream 3 heard from recently
    peer.conn.expire(now + 30, 10)
    frames = peer.frames()
    assert [(f.kind, f.sid) for f in frames] == [(HEADERS, 1), (RST_STREAM, 1)]
    assert frames[0].flags & END_STREAM
    assert peer.decode(frames[0])["grpc-status"] == str(GRPC_DEADLINE_EXCEEDED)
    assert peer.svc.recorders[1].resets == 1
    assert peer.svc.recorders[3].resets == 0
    assert list(peer.conn.streams) == [3]
    # A handler that does not wait for a message (a routed ext_proc stream) is left alone.
    peer.svc.recorders[3].awaiting = False
    peer.conn.expire(now + 1000, 10)
    assert peer.frames() == [] and list(peer.conn.streams) == [3]


async def test_raw_message_over_max_message_ends_the_stream() -> None:
    peer = Peer(max_message=100)
    peer.start()
    peer.send(peer.open(1), frame(DATA, 0, 1, grpc_message(b"x" * 100)))
    peer.send(frame(DATA, 0, 1, b"\x00" + u32(101)))  # only the prefix of the too-large one
    rec = peer.svc.recorders[1]
    assert rec.messages == [b"x" * 100] and rec.resets == 1
    frames = peer.frames()
    assert frames[0].kind == HEADERS and frames[0].flags & END_STREAM
    assert peer.decode(frames[0])["grpc-status"] == str(GRPC_RESOURCE_EXHAUSTED)
    assert frames[1] == Frame(RST_STREAM, 0, 1, u32(NO_ERROR))
    assert not peer.transport.closed


async def test_raw_message_over_max_message_in_parts_ends_the_stream_at_its_prefix() -> None:
    """A message kept across DATA frames is judged by its 5-byte prefix as soon as that is
    whole, even when the prefix itself came in two frames."""
    peer = Peer(max_message=100)
    peer.start()
    peer.send(peer.open(1), frame(DATA, 0, 1, b"\x00" + u32(101)[:2]))
    assert peer.svc.recorders[1].resets == 0
    peer.send(frame(DATA, 0, 1, u32(101)[2:] + b"x" * 10))
    rec = peer.svc.recorders[1]
    assert rec.messages == [] and rec.resets == 1
    assert peer.decode(peer.frames()[0])["grpc-status"] == str(GRPC_RESOURCE_EXHAUSTED)


async def test_raw_message_in_tiny_parts_pays_for_each_part() -> None:
    """A message sent one byte per DATA frame is charged what its parts really hold (each
    part's object, not only its byte), so the stream's bound ends it long before its bytes
    alone would reach the bound; and what it held is given back."""
    bound = 1 << 16
    peer = Peer(max_message=bound, limits=Limits(stream_memory=bound, stream_window=bound))
    peer.start()
    message = grpc_message(b"x" * 4000)
    peer.send(peer.open(1))
    for i in range(len(message)):
        peer.send(frame(DATA, 0, 1, message[i : i + 1]))
        if peer.svc.recorders[1].resets:
            break
    rec = peer.svc.recorders[1]
    assert rec.messages == [] and rec.resets == 1
    assert i + 1 <= bound // (1 + PART_OVERHEAD) + 1  # ended after ~1000 one-byte parts, not 65,536
    assert peer.decode(peer.frames()[0])["grpc-status"] == str(GRPC_RESOURCE_EXHAUSTED)
    assert peer.conn.mem == 0


async def test_raw_compressed_message_is_unimplemented() -> None:
    peer = Peer()
    peer.start()
    peer.send(peer.open(1), frame(DATA, 0, 1, b"\x01" + u32(3) + b"abc"))
    (f, _) = peer.frames()
    assert peer.decode(f)["grpc-status"] == str(GRPC_UNIMPLEMENTED)
    assert peer.svc.recorders[1].messages == []


async def test_raw_connection_lost_resets_open_streams() -> None:
    closed: list[H2Connection] = []
    peer = Peer(on_close=closed.append)
    peer.start()
    peer.send(peer.open(1), peer.open(3))
    peer.svc.recorders[3].stream.finish()
    peer.conn.connection_lost(None)
    assert peer.svc.recorders[1].resets == 1
    assert peer.svc.recorders[3].resets == 0  # finished: not reset
    assert closed == [peer.conn]
    assert peer.conn.done is not None and peer.conn.done.done()


async def test_raw_trailers_only_response_with_a_quoted_message() -> None:
    peer = Peer()
    peer.start()
    peer.send(peer.open(1))
    peer.svc.recorders[1].stream.finish(9, "100% done, café")
    (f, rst) = peer.frames()
    fields = peer.decode(f)
    assert fields[":status"] == "200" and fields["grpc-status"] == "9"
    assert fields["grpc-message"] == "100%25 done, caf%C3%A9"
    assert rst == Frame(RST_STREAM, 0, 1, u32(NO_ERROR))  # the client had not half-closed
    peer.send(peer.open(3))
    peer.svc.recorders[3].stream.finish(2, "é" * 300)  # cut at 200 characters
    (f, _) = peer.frames()
    assert peer.decode(f)["grpc-message"] == "%C3%A9" * 200


# ======================================================================================
# hpack_cache
# ======================================================================================

REQUEST = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/envoy.service.ext_proc.v3.ExternalProcessor/Process"),
    (":authority", "epp"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]


def test_changes_table_on_encoder_blocks() -> None:
    enc = hpack.Encoder()
    first = bytes(enc.encode(REQUEST))
    assert changes_table(first)  # literals with incremental indexing
    again = bytes(enc.encode(REQUEST))
    assert not changes_table(again)  # all indexed
    assert all(b & 0x80 for b in again)
    enc.header_table_size = 256
    resized = bytes(enc.encode(REQUEST))
    assert changes_table(resized)  # a dynamic table size update
    assert not changes_table(b"")
    assert not changes_table(literal("x-a", "b") + literal("grpc-status", "0") + b"\x88")
    never = bytes(enc.encode([hpack.NeverIndexedHeaderTuple("authorization", "secret")]))
    assert never[0] & 0xF0 == 0x10 and not changes_table(never)


def test_changes_table_rejects_truncated_blocks() -> None:
    for block in (b"\x00\x05ab", b"\x00", b"\x0f", b"\x00\x7f", b"\x00\x03abc\x7f\xff\xff\xff\xff\xff\xff"):
        with pytest.raises(HpackError):
            changes_table(block)


def _plain(decoder: hpack.Decoder, block: bytes) -> tuple[tuple[str, str], ...]:
    return tuple((str(k), str(v)) for k, v in decoder.decode(block, raw=False))


def test_header_decoder_matches_a_plain_decoder() -> None:
    rng = random.Random(0)
    pool = [
        [*REQUEST, ("x-request-id", f"id-{i}"), ("x-model", rng.choice(["a", "b", "c"]))] for i in range(40)
    ]
    enc, plain, cached = hpack.Encoder(), hpack.Decoder(), HeaderDecoder(64 * 1024)
    hits = 0
    previous = pool[0]
    for i in range(400):
        r = rng.random()
        if r < 0.5:
            fields = previous  # a repeat: all indexed, the cache's case
        elif r < 0.9:
            fields = rng.choice(pool)
        else:
            fields = [*REQUEST, (f"x-new-{i}", "v" * rng.randrange(0, 300))]
        if rng.random() < 0.05:
            enc.header_table_size = rng.choice([0, 128, 512, 4096])  # evictions, size updates
        block = bytes(enc.encode(fields))
        hits += not changes_table(block)
        expected = _plain(plain, block)
        assert cached.decode(block) == expected == tuple(fields), i
        previous = fields
    assert hits > 50  # the cache was exercised


def test_header_decoder_never_returns_stale_fields() -> None:
    enc, plain, cached = hpack.Encoder(), hpack.Decoder(), HeaderDecoder(64 * 1024)
    a = [("x-a", "one"), ("x-b", "two")]
    first = bytes(enc.encode(a))
    assert cached.decode(first) == _plain(plain, first) == tuple(a)
    indexed = bytes(enc.encode(a))  # refers to the dynamic table's entries 62 and 63
    assert not changes_table(indexed)
    assert cached.decode(indexed) == _plain(plain, indexed) == tuple(a)
    assert cached.decode(indexed) == tuple(a)  # from the cache
    # two new entries: the same indexes now mean other fields
    b = [("x-c", "three"), ("x-d", "four")]
    other = bytes(enc.encode(b))
    assert changes_table(other)
    assert cached.decode(other) == _plain(plain, other) == tuple(b)
    expected = _plain(plain, indexed)
    assert expected != tuple(a)
    assert cached.decode(indexed) == expected


def test_header_decoder_errors() -> None:
    cached = HeaderDecoder(64 * 1024)
    with pytest.raises(HpackError):
        cached.decode(bytes([0x80 | 70]))
    small = HeaderDecoder(100)
    with pytest.raises(HpackError):
        small.decode(literal("x-big", "v" * 200))


@pytest.mark.parametrize("length", [0, 1, 126, 127, 128, 200, 255, 1000, 20_000])
def test_literal_round_trips(length: int) -> None:
    value = "".join(random.Random(length).choice("abcXYZ019 -_/%") for _ in range(length))
    name = "x-" + "n" * min(length, 300)
    block = literal(name, value) + literal("grpc-status", "0")
    decoder = hpack.Decoder(max_header_list_size=1 << 20)
    assert _plain(decoder, block) == ((name, value), ("grpc-status", "0"))
    assert not changes_table(block)
    assert not decoder.header_table.dynamic_entries  # no table use


def test_literal_rejects_non_ascii() -> None:
    with pytest.raises(UnicodeEncodeError):
        literal("grpc-message", "café")
