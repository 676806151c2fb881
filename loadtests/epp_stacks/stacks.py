#!/usr/bin/env python3
"""Null Endpoint Pickers on each candidate HTTP/2 stack: the same answers, different transports.

Every stack runs ``null_epp.py``'s :class:`NullPick` (the answers specgate's EPP gives, the
route fixed, each ProcessingRequest parsed), so what differs between them is the HTTP/2
and gRPC machinery alone:

- ``hand``: the hand-written server in ``gateway/envoy/h2*.py`` composed as ``EppServer``
  composes it (the ``epp.limits`` defaults, a process-wide memory pool, the gateway's accept
  loop), on uvloop, deciding in the protocol's ``data_received``;
- ``h2``: the ``h2`` library on an asyncio protocol (:mod:`h2_server`), on uvloop;
- ``grpc-sync``: grpcio's C-core server with a thread pool (``grpc.server``), generic
  handlers with raw-bytes (de)serializers, the DoS options of :data:`GRPC_OPTIONS`;
- ``grpc-aio``: the same C-core under ``grpc.aio``, on an asyncio loop in its own thread;
- ``grpc-sync-hop`` / ``grpc-aio-hop``: as above, each message's decision run on a separate
  uvloop loop (in the gateway, its main loop, where the EPP's state lives) and the answer
  handed back: what putting specgate's EPP on grpcio would cost.

    python loadtests/epp_stacks/stacks.py --stack h2 --endpoint 127.0.0.1:8000 --port-file FILE

Not a product component: a benchmark reference only.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import signal
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

import h2_server  # noqa: E402
import null_epp  # noqa: E402

from gateway.envoy import messages as m  # noqa: E402

STACKS = ("hand", "h2", "grpc-sync", "grpc-aio", "grpc-sync-hop", "grpc-aio-hop")
SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
PROCESS_PATH = f"/{SERVICE}/Process"
MAX_MESSAGE = 4 * 1024 * 1024
# Concurrent streams per connection, every stack. A watched request's stream lasts as long as
# its response, so the EPP needs hundreds; and grpc-sync needs headroom above what Envoy has
# in flight: at 128, behind Envoy's one-trip layout (each stream reset once answered), its
# C-core refused new streams (REFUSED_STREAM, a 500 from Envoy) while reset ones still
# counted, their handler threads not yet finished, until it refused every stream.
MAX_STREAMS = 1024
THREADS = 128  # grpc-sync: a stream holds a worker thread for its whole life
# grpc-sync: no maximum_concurrent_rpcs: calls past the pool's threads wait for one (the
# streams per connection and the connection cap bound them).
MAX_RPCS: int | None = None

# grpcio C-core's server-side budgets (channel arguments), set as the EPP would set them.
GRPC_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_concurrent_streams", MAX_STREAMS),  # SETTINGS_MAX_CONCURRENT_STREAMS
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_metadata_size", 16 * 1024),  # SETTINGS_MAX_HEADER_LIST_SIZE
    ("grpc.http2.max_ping_strikes", 2),  # GOAWAY after this many pings too early
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.max_connection_idle_ms", 3_600_000),
    ("grpc.max_allowed_incoming_connections", 64),
    ("grpc.so_reuseport", 0),
]


def _answers(endpoint: str) -> dict[str, bytes]:
    return {
        phase: m.routed(phase, endpoint, {}, None, null_epp._TAGS)
        for phase in (m.REQUEST_HEADERS, m.REQUEST_BODY)
    }


class Outbox:
    """The stream a :class:`NullPick` writes to, for the gRPC stacks: answers collected per
    message, an abort kept as the call's status."""

    __slots__ = ("error", "out", "path")

    def __init__(self) -> None:
        self.out: list[bytes] = []
        self.error: tuple[int, str] | None = None
        self.path = PROCESS_PATH

    def send(self, message: bytes) -> None:
        self.out.append(message)

    def abort(self, status: int, message: str) -> None:
        self.error = (status, message)

    def finish(self, status: int = 0, message: str = "") -> None:
        return None

    def take(self) -> list[bytes]:
        out, self.out = self.out, []
        return out


_CODES = {s.value[0]: s for s in grpc.StatusCode}


class Hop:
    """The gateway's loop (uvloop, its own thread here; the main thread in the gateway): a
    decision made there from a gRPC thread or another loop, its answer handed back."""

    def __init__(self) -> None:
        import uvloop

        self.runner = LoopThread("gateway-loop", uvloop.new_event_loop)
        self.loop = self.runner.loop

    def call(self, fn: Callable[[], Any]) -> Any:
        """From a thread: run ``fn`` on the gateway's loop and wait for its result."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as e:  # handed back to the caller
                fut.set_exception(e)

        self.loop.call_soon_threadsafe(run)
        return fut.result()

    async def call_async(self, fn: Callable[[], Any]) -> Any:
        """From another loop: the same, awaited."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_as_coro(fn), self.loop))

    def stop(self) -> None:
        self.runner.stop()


async def _as_coro(fn: Callable[[], Any]) -> Any:
    return fn()


def _sync_handler(answers: dict[str, bytes], hop: Hop | None) -> grpc.GenericRpcHandler:
    def process(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        box = Outbox()
        pick = null_epp.NullPick(box, answers)  # type: ignore[arg-type]
        for req in requests:
            if hop is None:
                pick.on_message(req)
            else:
                hop.call(lambda req=req: pick.on_message(req))
            yield from box.take()
            if box.error is not None:
                context.abort(_CODES[box.error[0]], box.error[1])

    method = grpc.stream_stream_rpc_method_handler(process)  # no (de)serializers: raw bytes
    return grpc.method_handlers_generic_handler(SERVICE, {"Process": method})


def _aio_handler(answers: dict[str, bytes], hop: Hop | None) -> grpc.GenericRpcHandler:
    async def process(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        box = Outbox()
        pick = null_epp.NullPick(box, answers)  # type: ignore[arg-type]
        async for req in requests:
            if hop is None:
                pick.on_message(req)
            else:
                await hop.call_async(lambda req=req: pick.on_message(req))
            for out in box.take():
                yield out
            if box.error is not None:
                await context.abort(_CODES[box.error[0]], box.error[1])

    method = grpc.stream_stream_rpc_method_handler(process)
    return grpc.method_handlers_generic_handler(SERVICE, {"Process": method})


def _pick_services(answers: dict[str, bytes]) -> Callable[[Any], Any]:
    def services(stream: Any) -> Any:
        return null_epp.NullPick(stream, answers) if stream.path == PROCESS_PATH else None

    return services


def _start_hand(answers: dict[str, bytes], host: str) -> Running:
    """The hand-written server composed as ``EppServer`` composes it: the budgets and memory
    bounds of the ``epp.limits`` defaults, one process-wide memory pool, and the gateway's
    accept loop (connection cap, accept rate, a cool-down for a peer whose connection
    crossed a budget)."""
    import time

    import uvloop

    from gateway.api.epp.listener import Listener
    from gateway.api.epp.server import h2_limits
    from gateway.config.epp import EppConfig
    from gateway.envoy.h2guard import MemoryPool, Turn

    cfg = EppConfig()
    limits, pool = h2_limits(cfg), MemoryPool(cfg.limits.process_memory_bytes)
    turn = Turn(limits.slice_s)
    conns: set[Any] = set()
    runner = LoopThread("epp-hand", uvloop.new_event_loop)

    def closed(conn: Any) -> None:
        conns.discard(conn)
        listener.open = len(conns)
        if conn.error_code:
            listener.strike(conn.peer_host, time.monotonic())

    def connection() -> Any:
        conn = null_epp.H2Connection(
            _pick_services(answers),
            max_streams=MAX_STREAMS,
            max_message=MAX_MESSAGE,
            limits=limits,
            pool=pool,
            turn=turn,
            on_close=closed,
        )
        conns.add(conn)
        listener.open = len(conns)
        return conn

    listener = Listener(
        connection, max_connections=cfg.limits.max_connections, accepts_per_s=cfg.limits.accepts_per_s
    )
    port = asyncio.run_coroutine_threadsafe(listener.start(host, 0), runner.loop).result(10)

    def stop() -> None:
        async def close() -> None:
            await listener.stop()
            for conn in list(conns):
                conn.close()
            await asyncio.sleep(0)

        asyncio.run_coroutine_threadsafe(close(), runner.loop).result(10)
        runner.stop()

    return Running("hand", port, stop)


@dataclass
class Running:
    """A null EPP serving on ``port`` until :meth:`stop`."""

    stack: str
    port: int
    stop: Callable[[], None]


class LoopThread:
    """An event loop running in a thread of its own until :meth:`stop`, then closed there."""

    def __init__(self, name: str, factory: Callable[[], asyncio.AbstractEventLoop]) -> None:
        self.loop = factory()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        loop.run_forever()
        tasks = asyncio.all_tasks(loop)
        for t in tasks:
            t.cancel()
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def start(stack: str, endpoint: str, host: str = "127.0.0.1") -> Running:
    """Start the null EPP of ``stack`` on an ephemeral port, in threads of this process."""
    import uvloop

    answers = _answers(endpoint)
    if stack == "hand":
        return _start_hand(answers, host)
    if stack == "h2":
        runner = LoopThread("epp-h2", uvloop.new_event_loop)
        loop = runner.loop
        listener = h2_server.Listener(_pick_services(answers), max_streams=MAX_STREAMS)

        async def listen() -> asyncio.Server:
            return await asyncio.get_running_loop().create_server(listener, host, 0, backlog=4096)

        server = asyncio.run_coroutine_threadsafe(listen(), loop).result(10)

        def stop_h2() -> None:
            async def close() -> None:
                server.close()
                listener.close_all()
                await asyncio.sleep(0)  # the transports' closing callbacks

            asyncio.run_coroutine_threadsafe(close(), loop).result(10)
            runner.stop()

        return Running(stack, server.sockets[0].getsockname()[1], stop_h2)

    hop = Hop() if stack.endswith("-hop") else None
    if stack.startswith("grpc-sync"):
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=THREADS)
        sync_server = grpc.server(
            pool,
            handlers=[_sync_handler(answers, hop)],
            options=GRPC_OPTIONS,
            maximum_concurrent_rpcs=MAX_RPCS,
        )
        port = sync_server.add_insecure_port(f"{host}:0")
        sync_server.start()

        def stop_sync() -> None:
            sync_server.stop(0).wait(5)
            if hop is not None:
                hop.stop()

        return Running(stack, port, stop_sync)
    if stack.startswith("grpc-aio"):
        aio_runner = LoopThread("epp-grpc-aio", asyncio.new_event_loop)
        aio_loop = aio_runner.loop

        async def aio_start() -> tuple[grpc.aio.Server, int]:
            srv = grpc.aio.server(handlers=[_aio_handler(answers, hop)], options=GRPC_OPTIONS)
            p = srv.add_insecure_port(f"{host}:0")
            await srv.start()
            return srv, p

        aio_server, port = asyncio.run_coroutine_threadsafe(aio_start(), aio_loop).result(10)

        def stop_aio() -> None:
            asyncio.run_coroutine_threadsafe(aio_server.stop(0), aio_loop).result(10)
            aio_runner.stop()
            if hop is not None:
                hop.stop()

        return Running(stack, port, stop_aio)
    raise ValueError(f"unknown stack {stack!r}: one of {', '.join(STACKS)}")


def versions() -> dict[str, str]:
    """The versions of the libraries under test."""
    import importlib.metadata as md

    return {name: md.version(name) for name in ("grpcio", "h2", "hpack", "hyperframe", "uvloop")} | {
        "python": sys.version.split()[0]
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stack", required=True, choices=STACKS)
    ap.add_argument("--endpoint", required=True, help="ip:port every request is routed to")
    ap.add_argument("--port-file", required=True, help="where to write the port listened on")
    args = ap.parse_args()
    running = start(args.stack, args.endpoint)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    Path(args.port_file).write_text(str(running.port))
    done.wait()
    running.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
