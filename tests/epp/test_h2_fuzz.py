"""Frame-level fuzzing of the EPP's HTTP/2 listener (:class:`H2Connection`).

Random sequences of frames (any type, flags and stream id; payloads random or well formed:
header blocks, gRPC messages, SETTINGS, window increments), cut into reads at random
places, with small memory bounds. Whatever comes, the connection serves or closes with
GOAWAY (or, after the peer's GOAWAY, once no stream is left); ``data_received`` never
raises; what it holds stays within the connection's bound
and is all freed when the connection goes.
"""

from __future__ import annotations

import asyncio
import struct

import hpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.envoy.h2 import H2Connection
from gateway.envoy.h2guard import Limits, MemoryPool
from gateway.envoy.h2wire import GOAWAY, PREFACE
from tests.epp.test_h2 import FakeTransport, TestServices, frame, grpc_message, parse_frames

PATHS = ["/test.Echo/Chat", "/test.Echo/Unary", "/test.Raw/Record", "/test.Echo/Later", "/nope"]
LIMITS = Limits(
    stream_memory=1 << 16,
    connection_memory=1 << 17,
    connection_window=1 << 17,
    stream_window=1 << 14,
    ping=(10.0, 20.0),
    settings=(10.0, 20.0),
    continuation=(10.0, 20.0),
    empty=(10.0, 20.0),
    other=(10.0, 20.0),
)


@st.composite
def payloads(draw: st.DrawFn, kind: int) -> bytes:
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return draw(st.binary(max_size=64))
    if kind == 1 or kind == 9:  # HEADERS, CONTINUATION: a real header block
        path = draw(st.sampled_from(PATHS))
        fields = [(":method", "POST"), (":path", path), ("content-type", "application/grpc")]
        return bytes(hpack.Encoder().encode(fields))
    if kind == 0:  # DATA: gRPC messages, or a prefix announcing a large one
        if draw(st.booleans()):
            return b"\x00" + struct.pack(">I", draw(st.integers(0, 1 << 20)))
        return grpc_message(draw(st.binary(max_size=300)))
    if kind == 4:  # SETTINGS
        n = draw(st.integers(0, 3))
        return b"".join(
            struct.pack(">HI", draw(st.integers(1, 7)), draw(st.integers(0, (1 << 32) - 1))) for _ in range(n)
        )
    if kind in (3, 8):  # RST_STREAM, WINDOW_UPDATE
        return struct.pack(">I", draw(st.integers(0, (1 << 32) - 1)))
    if kind == 6:  # PING
        return draw(st.binary(min_size=8, max_size=8))
    return draw(st.binary(max_size=16))


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    kind = draw(st.integers(0, 12))
    flags = draw(st.sampled_from([0, 1, 4, 5, 8, 0x20, 0x25, draw(st.integers(0, 255))]))
    sid = draw(st.sampled_from([0, 1, 2, 3, 5, 7, 9, (1 << 31) - 1]))
    return frame(kind, flags, sid, draw(payloads(kind)))


async def _feed(data: bytes, cuts: list[int]) -> None:
    pool = MemoryPool(1 << 30)
    svc = TestServices()
    transport = FakeTransport()
    conn = H2Connection(svc, max_streams=8, max_message=1 << 15, limits=LIMITS, pool=pool)
    conn.connection_made(transport)  # type: ignore[arg-type]
    pos = 0
    for cut in [*sorted(cuts), len(data)]:
        if transport.closed:
            break
        conn.data_received(data[pos:cut])  # must not raise
        pos = max(pos, cut)
        await asyncio.sleep(0)  # the next slice, answers from tasks
        assert conn.mem <= LIMITS.connection_memory
        assert pool.used == conn.mem
    for _ in range(3):
        await asyncio.sleep(0)
    if transport.closed:  # our GOAWAY ended it, or the peer's (with no stream left)
        written = parse_frames(bytes(transport.data))
        assert (written and written[-1].kind == GOAWAY) or (conn._going_away and not conn.streams)
    conn.connection_lost(None)
    for t in list(svc.tasks):
        t.cancel()
    assert pool.used == 0 and conn.mem == 0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=st.lists(frames(), max_size=40),
    cuts=st.lists(st.integers(0, 4000), max_size=6),
    preface=st.booleans(),
)
def test_random_frames_are_served_or_end_with_goaway(
    body: list[bytes], cuts: list[int], preface: bool
) -> None:
    start = PREFACE + frame(4, 0, 0) if preface else b""
    asyncio.run(_feed(start + b"".join(body), cuts))
