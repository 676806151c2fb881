"""What one HTTP/2 peer may cost the EPP's listener (:mod:`gateway.envoy.h2guard`): each
flood of the attack suite (``loadtests/epp_attack.py``) ends its connection with GOAWAY
ENHANCE_YOUR_CALM within a second, memory stays within its bounds, a stream's window past
2^31-1 is reset with FLOW_CONTROL_ERROR, a peer that does not read stops being read, and the
listener caps connections and cools down a peer that crossed a budget.

Floods go through a real loopback socket to :class:`H2Connection` served by asyncio; the
finer checks drive it through the fake transport of ``test_h2.py``.
"""

from __future__ import annotations

import asyncio
import functools
import struct
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import hpack
import pytest
from aiohttp.test_utils import TestServer

from gateway.api.app import build_app
from gateway.api.epp.listener import Listener
from gateway.api.epp.server import EPP
from gateway.api.state import STATE
from gateway.config import PairConfig
from gateway.envoy.h2 import H2Connection
from gateway.envoy.h2guard import Limits, MemoryPool, Turn
from gateway.envoy.h2stream import Stream
from gateway.envoy.h2wire import (
    CONTINUATION,
    DATA,
    END_HEADERS,
    ENHANCE_YOUR_CALM,
    FLOW_CONTROL_ERROR,
    GOAWAY,
    HEADERS,
    INITIAL_WINDOW_SIZE,
    PING,
    PREFACE,
    PRIORITY,
    RST_STREAM,
    WINDOW_UPDATE,
)
from specgate_lab.emulator.launch import EmulatorGroup
from tests.conftest import gateway_config_for
from tests.epp.test_h2 import Frame, Peer, frame, grpc_message, parse_frames, settings, u32

GRPC = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/test.Raw/Hold"),
    (":authority", "epp"),
    ("content-type", "application/grpc"),
]


@dataclass
class Hold:
    """A handler that never answers (a stream waiting for its request)."""

    stream: Stream
    awaiting: bool = True

    def on_message(self, message: bytes) -> None:
        return None

    def on_end(self) -> None:
        return None

    def on_reset(self) -> None:
        return None


@pytest.fixture
async def listening() -> AsyncIterator[int]:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: H2Connection(Hold, limits=Limits()), "127.0.0.1", 0)
    try:
        yield int(server.sockets[0].getsockname()[1])
    finally:
        server.close()


def _flood(name: str) -> tuple[bytes, bytes]:
    """(what opens the attack, one burst of it)."""
    enc = hpack.Encoder()
    first = enc.encode(GRPC)
    block = enc.encode(GRPC)
    if name == "rapid_reset":
        burst = b"".join(
            frame(HEADERS, END_HEADERS, s, block) + frame(RST_STREAM, 0, s, u32(8)) for s in range(3, 4003, 2)
        )
        return frame(HEADERS, END_HEADERS, 1, first), burst
    if name == "continuation":
        return frame(HEADERS, 0, 1, first), frame(CONTINUATION, 0, 1) * 4000
    if name == "ping":
        return b"", frame(PING, 0, 0, b"12345678") * 4000
    if name == "settings":
        return b"", settings({INITIAL_WINDOW_SIZE: 65_535}) * 4000
    if name == "window_update":
        return b"", frame(WINDOW_UPDATE, 0, 0, u32(1)) * 20_000
    if name == "empty_data":
        return frame(HEADERS, END_HEADERS, 1, first), frame(DATA, 0, 1) * 4000
    if name == "priority":
        return b"", frame(PRIORITY, 0, 1, u32(0) + b"\x10") * 4000
    raise AssertionError(name)


@pytest.mark.parametrize(
    "name", ["rapid_reset", "continuation", "ping", "settings", "window_update", "empty_data", "priority"]
)
async def test_a_flood_ends_its_connection_with_enhance_your_calm_within_a_second(
    listening: int, name: str
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", listening)
    opening, burst = _flood(name)
    writer.write(PREFACE + settings({}) + opening)
    t0 = time.monotonic()
    writer.write(burst)
    data = b""
    try:
        while GOAWAY not in {f.kind for f in parse_frames(_whole(data))}:
            chunk = await asyncio.wait_for(reader.read(1 << 16), 5.0)
            assert chunk, "closed without GOAWAY"
            data += chunk
        took = time.monotonic() - t0
        (goaway,) = [f for f in parse_frames(_whole(data)) if f.kind == GOAWAY]
        assert struct.unpack(">I", goaway.payload[4:8])[0] == ENHANCE_YOUR_CALM
        assert took < 1.0
        try:  # and closed (reset, where it had not read all the flood)
            assert await asyncio.wait_for(reader.read(), 5.0) == b""
        except ConnectionResetError:
            pass
    finally:
        writer.close()


def _whole(data: bytes) -> bytes:
    """The complete frames at the start of ``data``."""
    pos = 0
    while len(data) - pos >= 9:
        n = int.from_bytes(data[pos : pos + 3], "big")
        if len(data) - pos < 9 + n:
            break
        pos += 9 + n
    return data[:pos]


async def test_a_stream_window_past_2_31_is_reset_with_flow_control_error() -> None:
    peer = Peer()
    peer.start()
    peer.send(peer.open(1, "/test.Raw/Record"), frame(WINDOW_UPDATE, 0, 1, u32((1 << 31) - 1)))
    assert peer.frames() == [Frame(RST_STREAM, 0, 1, u32(FLOW_CONTROL_ERROR))]
    assert not peer.transport.closed and 1 not in peer.conn.streams
    assert peer.svc.recorders[1].resets == 1


async def test_data_beyond_the_connection_window_is_a_flow_control_error() -> None:
    """A peer that keeps sending parts of a message past the window: the connection ends, what
    it held is freed."""
    pool = MemoryPool(1 << 30)
    peer = Peer(max_message=100_000, limits=Limits(connection_window=200_000), pool=pool)
    peer.start()
    announce = b"\x00" + u32(99_000)
    peer.send(peer.open(1, "/test.Raw/Record"))
    for sid in (3, 5):
        peer.send(peer.open(sid, "/test.Raw/Record"))
    sent = 0
    for sid in (1, 3, 5):  # three messages of 99 kB, each but its last byte
        body = announce + b"x" * 98_999
        for i in range(0, len(body), 16_384):
            peer.send(frame(DATA, 0, sid, body[i : i + 16_384]))
            sent += len(body[i : i + 16_384])
            if peer.transport.closed:
                break
    _, code = peer.goaway()
    assert code == FLOW_CONTROL_ERROR and sent > 200_000
    assert peer.conn.mem <= 200_000
    peer.conn.connection_lost(None)
    assert pool.used == 0 and peer.conn.mem == 0


async def test_the_process_bound_ends_the_stream_that_would_cross_it() -> None:
    pool = MemoryPool(150_000)
    a = Peer(max_message=100_000, pool=pool)
    b = Peer(max_message=100_000, pool=pool)
    for p in (a, b):
        p.start()
        p.send(p.open(1, "/test.Raw/Record"), frame(DATA, 0, 1, b"\x00" + u32(99_000) + b"x" * 16_000))
    more = b"x" * 16_000
    for _ in range(5):
        a.send(frame(DATA, 0, 1, more))
    assert pool.used <= 150_000
    for _ in range(5):
        b.send(frame(DATA, 0, 1, more))
    assert pool.used <= 150_000
    trailers = [f for f in b.frames() if f.kind == HEADERS]
    assert trailers and b.decode(trailers[-1])["grpc-status"] == "8"  # RESOURCE_EXHAUSTED
    assert not b.transport.closed  # the stream, not the connection
    # b asked for more than the EPP holds: its frames now wait in the slower line; a did not
    assert b.conn.overdrawn_streams == 1 and b.conn.turn is not a.conn.turn
    assert a.conn.overdrawn_streams == 0


async def test_answers_a_peer_never_lets_out_are_bounded_per_stream() -> None:
    """SETTINGS_INITIAL_WINDOW_SIZE=0 and an echo: the answers wait for a window that never
    opens, up to the stream's bound; then the stream is reset and its queue dropped."""
    peer = Peer(max_message=1 << 16, limits=Limits(stream_memory=1 << 18, connection_memory=1 << 20))
    peer.start({INITIAL_WINDOW_SIZE: 0})
    peer.send(peer.open(1, "/test.Echo/Chat"))
    for _ in range(30):
        peer.send(frame(DATA, 0, 1, grpc_message(b"x" * 15_000)))
    frames = peer.frames()
    assert Frame(RST_STREAM, 0, 1, u32(ENHANCE_YOUR_CALM)) in frames
    assert peer.conn.mem == 0 and not peer.transport.closed
    assert peer.conn.overdrawn_streams == 1  # the slower line from now on


async def test_a_peer_that_does_not_read_is_not_read() -> None:
    peer = Peer()
    peer.start()
    peer.conn.pause_writing()  # the socket's output passed its bound
    assert peer.transport.paused
    peer.conn.resume_writing()
    assert not peer.transport.paused
    peer.conn.pause_writing()
    peer.conn.expire(time.monotonic() + 11.0, 60.0, 10.0)
    assert peer.transport.closed


async def test_the_listener_caps_connections_and_cools_down_a_peer_that_crossed_a_budget() -> None:
    opened: list[asyncio.BaseTransport] = []
    two = asyncio.Event()

    class Keep(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            opened.append(transport)
            listener.open = len(opened)  # as the EPP server counts its connections
            if len(opened) == 2:
                two.set()

    listener = Listener(Keep, max_connections=2, accepts_per_s=1000.0)
    port = await listener.start("127.0.0.1", 0)
    try:
        conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        await asyncio.wait_for(two.wait(), 5.0)
        r, w = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(r.read(), 5.0) == b""  # the third: closed as it came
        assert listener.refused == 1
        w.close()
        for t in opened:
            t.close()
        opened.clear()
        listener.open = 0
        listener.strike("127.0.0.1", time.monotonic())
        r, w = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(r.read(), 5.0) == b""  # refused while it cools down
        assert listener.refused == 2 and not opened
        w.close()
        for _, cw in conns:
            cw.close()
    finally:
        await listener.stop()


async def test_one_connections_frames_hold_the_loop_a_slice_at_a_time() -> None:
    """A read of many frames is handled in slices: the loop runs other work between them."""
    peer = Peer(limits=Limits(slice_s=0.0))
    peer.start()
    peer.send(frame(PING, 0, 0, b"abcdefgh") * 64)
    # one slice (the clock is read every 32 frames), then the loop's turn
    assert len(peer.frames()) == 31 and peer.transport.paused
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(peer.frames()) == 33 and not peer.transport.paused


async def test_connections_share_one_turn_of_the_loop_in_order() -> None:
    """Two connections with frames waiting in the same turn: the first takes the turn's
    budget, the second waits for the next turn; then they go on in the order they waited."""
    turn = Turn(0.0)  # one slice a turn, whoever takes it
    a, b = (Peer(limits=Limits(slice_s=0.0), turn=turn) for _ in range(2))
    a.start()
    await asyncio.sleep(0)  # a turn each for the handshakes
    b.start()
    await asyncio.sleep(0)
    a.send(frame(PING, 0, 0, b"abcdefgh") * 64)
    b.send(frame(PING, 0, 0, b"abcdefgh") * 64)
    assert len(a.frames()) == 31 and len(b.frames()) == 0  # b: after a, in a later turn
    assert a.transport.paused and b.transport.paused
    await asyncio.sleep(0)
    assert len(a.frames()) == 31 and len(b.frames()) == 0  # a's rest came first
    for _ in range(4):
        await asyncio.sleep(0)
    assert len(a.frames()) == 2 and len(b.frames()) == 64
    assert not a.transport.paused and not b.transport.paused


async def test_a_slower_line_takes_only_its_share_of_the_loop() -> None:
    """Frames waiting in a line of ``share`` below 1, after a turn that spent its budget,
    resume only once the loop's other work had its share of the time (``share`` 0.5: as long
    again as the line took); with ``share`` 1 they resume at the next turn."""
    for share, runs_next_turn in ((0.5, False), (1.0, True)):
        turn, ran = Turn(0.001, share=share), []
        turn.wait(functools.partial(ran.append, "a"))  # a connection that had to stop, as data_received does
        turn.charge(600.0)  # ... after its slice took (a synthetic) 600 s
        for _ in range(5):
            await asyncio.sleep(0)
        assert ran == (["a"] if runs_next_turn else []), share


async def test_a_slower_line_resumes_in_order_after_its_rest() -> None:
    turn, ran = Turn(0.001, share=0.5), []
    done = asyncio.Event()
    turn.wait(functools.partial(ran.append, "a"))
    turn.wait(lambda: (ran.append("b"), done.set()))
    turn.charge(0.002)  # the rest: 2 ms of the loop's other work
    await asyncio.wait_for(done.wait(), 5.0)
    assert ran == ["a", "b"]


async def test_data_past_a_reset_streams_window_ends_the_connection() -> None:
    """What was in flight when the server reset a stream is dropped; a peer that keeps sending
    on it past the window it had is ignoring the reset."""
    peer = Peer(limits=Limits(stream_window=40_000))
    peer.start({INITIAL_WINDOW_SIZE: 0})
    peer.send(peer.open(1, "/test.Raw/Record"))
    peer.svc.recorders[1].stream.reset()
    assert peer.frames() == [Frame(RST_STREAM, 0, 1, u32(ENHANCE_YOUR_CALM))]
    peer.send(frame(DATA, 0, 1, b"x" * 16_000), frame(DATA, 0, 1, b"x" * 16_000))
    assert not peer.transport.closed  # in flight: within the window
    peer.send(frame(DATA, 0, 1, b"x" * 16_000))
    _, code = peer.goaway()
    assert code == FLOW_CONTROL_ERROR


async def test_the_epp_cools_down_a_peer_whose_flood_it_ended(pair: EmulatorGroup) -> None:
    """Through the gateway's own EPP listener: a PING flood ends with ENHANCE_YOUR_CALM, the
    peer's next connection is closed as it comes, and ``/admin/state`` counts it."""
    app = build_app(gateway_config_for(pair, **{"epp.enabled": True, "epp.port": 0}))
    server = TestServer(app)
    await server.start_server()
    try:
        epp = app[EPP]
        reader, writer = await asyncio.open_connection("127.0.0.1", epp.port)
        writer.write(PREFACE + settings({}) + frame(PING, 0, 0, b"12345678") * 200)
        data = await asyncio.wait_for(reader.read(), 5.0)
        (goaway,) = [f for f in parse_frames(_whole(data)) if f.kind == GOAWAY]
        assert struct.unpack(">I", goaway.payload[4:8])[0] == ENHANCE_YOUR_CALM
        writer.close()
        r, w = await asyncio.open_connection("127.0.0.1", epp.port)
        assert await asyncio.wait_for(r.read(), 5.0) == b""  # refused while it cools down
        w.close()
        state = epp.admin_state()
        assert state["connections_refused"] == 1 and state["memory_bytes"] == 0
    finally:
        await server.close()


async def test_streams_opened_past_the_limit_count_as_early_resets() -> None:
    peer = Peer(max_streams=2, limits=Limits(early_reset=(10.0, 20.0)))
    peer.start()
    peer.send(*(peer.open(sid) for sid in range(1, 9, 2)))
    assert not peer.transport.closed  # two refused: within the budget
    peer.send(*(peer.open(sid) for sid in range(9, 101, 2)))
    _, code = peer.goaway()
    assert code == ENHANCE_YOUR_CALM


async def test_a_busy_peer_closing_its_ended_streams_stays_within_the_budgets() -> None:
    """Envoy at thousands of requests a second resets each ext_proc stream the server has ended
    and updates its window: frames in proportion to its streams, which each stream pays for.
    The same frames beyond what the streams paid still cross the budget."""
    peer = Peer(limits=Limits(slice_s=60.0))  # every read handled at once (slices are tested above)
    peer.start()
    cancel = u32(0x8)
    for sid in range(1, 2001, 2):  # 1,000 streams in one read, each answered, then closed twice over
        peer.send(
            peer.open(sid, "/test.Echo/Unary", end_stream=True),
            frame(RST_STREAM, 0, sid, cancel),
            frame(WINDOW_UPDATE, 0, sid, u32(100)),
        )
    assert not peer.transport.closed
    peer.frames()
    peer.send(*(frame(RST_STREAM, 0, 1, cancel) for _ in range(600)))  # no stream pays for these
    _, code = peer.goaway()
    assert code == ENHANCE_YOUR_CALM


async def test_the_epp_knows_a_pair_that_joins_and_forgets_it_when_gone(pair: EmulatorGroup) -> None:
    """Pairs that discovery adds are in the EPP's address book at once (Envoy's answers on them
    are attributed), and leave it once drained."""
    config = gateway_config_for(pair, **{"epp.enabled": True, "epp.port": 0})
    app = build_app(config)
    server = TestServer(app)
    await server.start_server()
    try:
        epp, state = app[EPP], app[STATE]
        assert state.fleet is not None
        model = config.models[0].name
        d = config.models[0].pairs[0].model_dump()  # the same engines' kind, on a dead port
        d.update(name="joined", device="joined")
        d["base"].update(name="joined-base", url="http://127.0.0.1:9")
        d["spec"].update(name="joined-spec", url="http://127.0.0.1:9")
        joined = PairConfig.model_validate(d)
        state.fleet.declare(model, "dns", {"joined": joined})
        assert {"joined-base", "joined-spec"} <= set(epp.book.engines)
        state.fleet.declare(model, "dns", {})
        await asyncio.wait_for(state.fleet.wait_gone(model, "joined"), 10.0)
        assert not {"joined-base", "joined-spec"} & set(epp.book.engines)
        first = config.models[0].pairs[0]
        assert first.spec is not None
        assert {first.base.name, first.spec.name} <= set(epp.book.engines)  # the first pair stays
    finally:
        await server.close()
