#!/usr/bin/env python3
"""A null Endpoint Picker: the floor of what any Python EPP on specgate's wire code costs.

It speaks the ext_proc protocol as ``specgate serve --epp-port`` does, on the same HTTP/2
and protobuf code (``gateway.envoy``), and routes every request to one fixed ``ip:port``
with precomputed answers: no JSON, no features, no policy, no telemetry, no slots. Set
beside specgate's EPP in ``bench_overhead.py`` (target ``envoy-epp-null``), the difference
between the two is what specgate's decision path costs; the difference between this and
Envoy with a static route is what an ext_proc exchange with a Python process costs at all.

    python loadtests/null_epp.py --endpoint 127.0.0.1:8000 --port-file FILE

Not a product component: a benchmark reference only.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.api.epp.server import PROCESS_PATH
from gateway.envoy import messages as m
from gateway.envoy.h2 import H2Connection
from gateway.envoy.h2stream import Stream

_TAGS = {"route": "base", "reason": "null", "engine": "base0"}


class NullPick:
    """One ext_proc stream: every phase answered as specgate's EPP answers it, the route fixed."""

    def __init__(self, stream: Stream, answers: dict[str, bytes]) -> None:
        self.stream = stream
        self.answers = answers
        self.deferred = False
        self.held = 0
        self.awaiting = True

    def on_message(self, message: bytes) -> None:
        inc = m.parse(message)  # the protocol's own cost: every EPP reads what it is sent
        send = self.stream.send
        if inc.kind == m.REQUEST_HEADERS:
            self.deferred = inc.full_duplex or (inc.body_mode == m.STREAMED and inc.body_without_waiting)
            if inc.end_of_stream:  # no body (GET /health): routed on its headers
                self.awaiting = False
                send(self.answers[m.REQUEST_HEADERS])
            elif not self.deferred:
                send(m.continue_headers(watch=False, body_mode=inc.body_mode))
        elif inc.kind == m.REQUEST_BODY:
            if not inc.end_of_stream:
                if self.deferred:
                    self.held += 1
                else:
                    send(m.CONTINUE_BODY)
                return
            self.awaiting = False
            if not self.deferred:
                send(self.answers[m.REQUEST_BODY])
                return
            send(self.answers[m.REQUEST_HEADERS])
            for _ in range(self.held + 1):
                send(m.CONTINUE_BODY)
        elif inc.kind == m.RESPONSE_HEADERS:
            send(m.CONTINUE_RESPONSE_HEADERS)
        elif inc.kind == m.RESPONSE_BODY:
            send(m.CONTINUE_RESPONSE_BODY)
        else:
            self.stream.abort(12, "unsupported ProcessingRequest")

    def on_end(self) -> None:
        self.stream.finish()

    def on_reset(self) -> None:
        return None


async def serve(endpoint: str, port_file: str, listening: asyncio.Event | None = None) -> None:
    """Serve until cancelled; the port goes to ``port_file``, then ``listening`` is set."""
    answers = {
        phase: m.routed(phase, endpoint, {}, None, _TAGS) for phase in (m.REQUEST_HEADERS, m.REQUEST_BODY)
    }

    def services(stream: Stream) -> NullPick | None:
        return NullPick(stream, answers) if stream.path == PROCESS_PATH else None

    conns: set[H2Connection] = set()

    def connection() -> H2Connection:
        conn = H2Connection(services, on_close=conns.discard)
        conns.add(conn)
        return conn

    loop = asyncio.get_running_loop()
    server = await loop.create_server(connection, "127.0.0.1", 0, backlog=4096)
    try:
        async with server:  # closed when cancelled
            Path(port_file).write_text(str(server.sockets[0].getsockname()[1]))  # noqa: ASYNC240 - once
            if listening is not None:
                listening.set()
            await asyncio.Event().wait()
    finally:
        for conn in list(conns):
            conn.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--endpoint", required=True, help="ip:port every request is routed to")
    ap.add_argument("--port-file", required=True, help="where to write the port listened on")
    args = ap.parse_args()
    import uvloop

    uvloop.run(serve(args.endpoint, args.port_file))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
