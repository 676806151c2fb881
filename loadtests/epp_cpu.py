#!/usr/bin/env python3
"""CPU per request of specgate's Endpoint Picker, in process: no sockets, no Envoy.

Feeds one HTTP/2 connection of the EPP (``gateway.envoy.h2``) the bytes Envoy's ext_proc
client sends for each request on the bootstrap ``specgate envoy-config`` writes: a stream's
HEADERS, then the ProcessingRequests of the request headers and the whole body, then
END_STREAM, as Envoy does when the response ends; ``--watched``: every request's response
headers too, as for the share of answers the EPP watches (or all, on an Envoy configured to
send them). The gateway state is the one ``specgate serve --epp-port`` runs
(models, policy, telemetry on), its engines never contacted. Prints the CPU per request
(the thread's CPU time over ``--requests`` streams, after a warm-up), the figure to set
against the proxy's own in-process figure (``overhead_cpu.py``).

    python loadtests/epp_cpu.py [--policy always-base] [--stream] [--watched] [--short] [--one-trip]
                                [--profile]

``--short``: the short chat body ``bench_overhead.py`` sends (one brief user turn) instead of
a 400-character summarisation prompt, whose overlap prediction costs more.

``--one-trip``: the unwatched path of ``specgate envoy-config --watch-share`` as Envoy sends
it: the stream's HEADERS, the request headers (STREAMED, the body sent without waiting) and
the whole body in one read, then RST_STREAM once the answers are in. Also prints the CPU
up to the answer's write (``critical_us``: what the request waits for), the rest (the reset:
releasing the slot, telemetry) coming after.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import sys
import time
from pathlib import Path

import hpack

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gateway.api.app import build_app
from gateway.api.epp.endings import AccessLogStream
from gateway.api.epp.server import EPP
from gateway.config import load_config
from gateway.envoy import h2, h2wire
from gateway.envoy.h2guard import Turn
from gateway.envoy.protowire import fields, ld
from gateway.telemetry import build_telemetry
from tests.epp.extproc_wire import ACCESS_LOG, request_body, request_headers, response_headers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_overhead import _payload

GRPC_HEADERS = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/envoy.service.ext_proc.v3.ExternalProcessor/Process"),
    (":authority", "specgate_epp"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
    ("grpc-timeout", "10000m"),
    ("x-envoy-internal", "true"),
]


class _Transport:
    def __init__(self) -> None:
        self.out: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.out.append(data)

    def close(self) -> None:
        return None

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default


def _message(payload: bytes) -> bytes:
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


async def run(args: argparse.Namespace) -> tuple[float, float]:
    overrides = {
        "epp.enabled": True,
        "epp.port": 0,
        "scrape.enabled": False,
        "models.0.pairs.0.spec.url": "http://127.0.0.2:9",
        "models.0.pairs.0.base.url": "http://127.0.0.1:9",
        "models.0.routing.policy": args.policy,
        # Which answers are watched is this script's choice (--watched), not the budget's.
        "epp.observe_per_s": 0,
    }
    cfg = load_config(None, env={}, overrides=overrides)
    app = build_app(cfg, telemetry=build_telemetry(cfg.telemetry, known_models=[m.name for m in cfg.models]))
    # frames are fed here without turns of the loop between them: no shared turn to wait for
    conn = h2.H2Connection(app[EPP].open_stream, turn=Turn(3600.0))
    transport = _Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    # As Envoy: large windows, so what the EPP sends never waits for a WINDOW_UPDATE.
    window = (1 << 31) - 1
    settings = h2wire._frame(
        h2wire.SETTINGS, 0, 0, h2wire._settings_payload({h2wire.INITIAL_WINDOW_SIZE: window})
    )
    grant = h2wire._frame(h2wire.WINDOW_UPDATE, 0, 0, (window - 65_535).to_bytes(4, "big"))
    conn.data_received(h2wire.PREFACE + settings + grant)
    encoder = hpack.Encoder()
    body = {
        "model": "qwen3-8b",
        "messages": [{"role": "user", "content": "Summarise: " + "the quick brown fox " * 20}],
        "max_tokens": 64,
        "temperature": 0.7,
        "stream": args.stream,
    }
    if args.short:  # bench_overhead.py's request, for this config's model
        body = {**json.loads(_payload(args.stream)), "model": "qwen3-8b"}
    one_trip = args.one_trip
    extra = dict(SDK_HEADERS) if args.sdk_headers else {}
    phases = [
        _message(request_headers(streamed=one_trip, without_waiting=one_trip, headers=extra)),
        _message(request_body(body)),
    ]
    if args.watched:
        phases.append(_message(response_headers(200)))
    sid = 1
    batch = args.access_log
    if batch:  # stream 1: Envoy's access log, one batch of entries every `batch` requests
        als = [(":method", "POST"), (":path", ACCESS_LOG), *GRPC_HEADERS[2:]]
        conn.data_received(h2wire._frame(h2wire.HEADERS, h2wire.END_HEADERS, 1, encoder.encode(als)))
        entry = _golden_entry()
        sid = 3
    pending: list[bytes] = []
    total_cpu = critical = 0.0
    prof = cProfile.Profile() if args.profile else None
    for i in range(args.warmup + args.requests):
        block = encoder.encode(GRPC_HEADERS)
        frames = [h2wire._frame(h2wire.HEADERS, h2wire.END_HEADERS, sid, block)]
        if batch:  # the request's id, for its entry
            rid = f"r{i:07d}".encode()
            head = request_headers(
                streamed=one_trip, without_waiting=one_trip, headers={**extra, "x-request-id": rid.decode()}
            )
            pending.append(entry.replace(GOLDEN_ID, rid))
            frames += [h2wire._frame(h2wire.DATA, 0, sid, p) for p in [_message(head), *phases[1:]]]
        else:
            frames += [h2wire._frame(h2wire.DATA, 0, sid, p) for p in phases]
        if one_trip:  # one read; Envoy resets the stream once it has its answers
            frames = [b"".join(frames), h2wire._frame(h2wire.RST_STREAM, 0, sid, (8).to_bytes(4, "big"))]
        else:  # one read per message, as Envoy's arrive; END_STREAM when the response ends
            frames.append(h2wire._frame(h2wire.DATA, h2wire.END_STREAM, sid, b""))
        measured = i >= args.warmup
        if prof is not None and measured:
            prof.enable()
        t0 = time.thread_time()
        conn.data_received(frames[0])
        t1 = time.thread_time()
        if one_trip:
            assert transport.out, "the answers were not written on the request's read"
        for f in frames[1:]:
            conn.data_received(f)
        last = i == args.warmup + args.requests - 1
        if pending and (len(pending) == batch or last):  # Envoy's batch: each entry ends its request
            logs = _message(ld(2, b"".join(ld(1, e) for e in pending)))
            for at in range(0, len(logs), 16_384):  # HTTP/2's default largest frame
                conn.data_received(h2wire._frame(h2wire.DATA, 0, 1, logs[at : at + 16_384]))
            for _ in range(-(-batch // AccessLogStream.SLICE)):  # a slice read per turn of the loop
                await asyncio.sleep(0)
            assert not conn.streams[1].handler.backlog
            pending.clear()
        if measured:
            total_cpu += time.thread_time() - t0
            critical += t1 - t0
        if prof is not None and measured:
            prof.disable()
        transport.out.clear()
        sid += 2
    assert len(conn.streams) == (1 if batch else 0), "streams left open"
    assert app[EPP].state.inflight == 0 and len(app[EPP].endings) == 0, "requests left unended"
    if prof is not None:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
    return total_cpu / args.requests, critical / args.requests


# The headers the OpenAI Python SDK (1.x) sends with a chat request, besides the pseudo-headers:
# what reaches the EPP where Envoy forwards every header (no forward_rules).
SDK_HEADERS = [
    ("accept", "application/json"),
    ("accept-encoding", "gzip, deflate"),
    ("content-type", "application/json"),
    ("content-length", "120"),
    ("user-agent", "AsyncOpenAI/Python 1.57.0"),
    ("authorization", "Bearer sk-none"),
    ("x-stainless-lang", "python"),
    ("x-stainless-package-version", "1.57.0"),
    ("x-stainless-os", "Linux"),
    ("x-stainless-arch", "x64"),
    ("x-stainless-runtime", "CPython"),
    ("x-stainless-runtime-version", "3.11.7"),
    ("x-stainless-async", "async:asyncio"),
    ("x-stainless-retry-count", "0"),
    ("x-stainless-read-timeout", "600"),
    ("x-forwarded-proto", "http"),
    ("x-request-id", "6f1c2a4e-8d0b-4b53-9a55-0c2d7d1e9f11"),
    ("x-envoy-expected-rq-timeout-ms", "600000"),
]
ROOT = Path(__file__).resolve().parents[1]
GOLDEN_ID = b"golden-1"


def _golden_entry() -> bytes:
    """The entry real Envoy wrote for a request (tests/epp/fixtures), its id 8 bytes long (in
    each place it appears)."""
    golden = json.loads((ROOT / "tests" / "epp" / "fixtures" / "access_log_golden.json").read_text())
    message = bytes.fromhex(golden["messages"][0]["hex"])
    (logs,) = [v for f, _, v in fields(message) if f == 2]
    (entry,) = [v for f, _, v in fields(logs) if f == 1]
    assert GOLDEN_ID in entry
    return entry


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", default="always-base", help="routing policy (default always-base)")
    ap.add_argument("--stream", action="store_true", help="streamed requests (the body's stream: true)")
    ap.add_argument("--watched", action="store_true", help="every request's response headers too")
    ap.add_argument("--short", action="store_true", help="bench_overhead.py's short chat body")
    ap.add_argument(
        "--one-trip", action="store_true", help="the unwatched path of envoy-config --watch-share (one read)"
    )
    ap.add_argument(
        "--access-log",
        type=int,
        default=0,
        metavar="N",
        help="Envoy streams its access log (envoy-config --access-log): one entry per request, "
        "in batches of N (at 500 req/s Envoy's 0.1 s flush makes 50)",
    )
    ap.add_argument(
        "--sdk-headers",
        action="store_true",
        help="the request headers as Envoy sends them without forward_rules: the OpenAI SDK's "
        "whole set (default: the pseudo-headers only, as with the generated bootstrap's rules)",
    )
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--profile", action="store_true", help="print a cProfile of the measured requests")
    args = ap.parse_args()
    total, critical = asyncio.run(run(args))
    out = {"policy": args.policy, "stream": args.stream, "watched": args.watched, "short": args.short}
    out |= {"one_trip": args.one_trip, "access_log": args.access_log, "sdk_headers": args.sdk_headers}
    out |= {"cpu_us_per_request": round(total * 1e6, 1)}
    if args.one_trip:
        out["critical_us"] = round(critical * 1e6, 1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
