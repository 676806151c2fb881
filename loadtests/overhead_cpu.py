#!/usr/bin/env python3
"""CPU the gateway adds per request, in one process: a robust A/B for code changes.

The end-to-end benchmark (``bench_overhead.py``) is noisy on a shared machine. Here the
upstream, the gateway (``build_app`` with the real telemetry, policy ``always-base`` or
``--policy``) and a
raw HTTP client run on one uvloop; requests go one at a time, in alternating batches
straight to the upstream and through the gateway, and the difference of
``time.process_time()`` per request is the gateway's own CPU (its server and client legs
included). ``--minimal`` measures a bare aiohttp forwarder (``null_proxy.py``) instead, for scale; ``--gap``
idles between requests (a cold path, as at a low request rate on a busy machine).

    .venv/bin/python loadtests/overhead_cpu.py [--stream] [--minimal] [--policy adaptive] [--batches 30]

Prints the median and quartile of the per-batch differences (µs per request).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import uvloop
from aiohttp import web
from bench_overhead import _Conn, _payload, upstream_app
from null_proxy import forwarder

from gateway.api.app import RUNNER_KWARGS, build_app
from gateway.config import load_config
from gateway.telemetry import build_telemetry

CONFIG = """\
server: {{host: 127.0.0.1, port: 0, max_concurrency: 100000}}
scrape: {{enabled: false}}
models:
  - name: bench
    pairs:
      - device: gpu0
        spec: {{name: spec0, url: "http://127.0.0.1:{up}", served_model_name: bench-upstream,
               method: ngram, k: 5}}
        base: {{name: base0, url: "http://127.0.0.1:{up}", served_model_name: bench-upstream}}
    routing: {{policy: {policy}}}
"""


async def _serve(app: web.Application, **kw: Any) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, **kw)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, runner.addresses[0][1]


async def run(args: argparse.Namespace) -> list[float]:
    loop = asyncio.get_running_loop()
    runners: list[web.AppRunner] = []
    up_runner, up = await _serve(upstream_app(8), access_log=None)
    runners.append(up_runner)
    session = aiohttp.ClientSession()
    if args.minimal:
        gw_runner, gw = await _serve(
            forwarder(f"127.0.0.1:{up}", session), access_log=None, handler_cancellation=True
        )
    else:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "gateway.yaml"
            path.write_text(CONFIG.format(up=up, policy=args.policy))
            cfg = load_config(str(path))
        app = build_app(cfg, telemetry=build_telemetry(cfg.telemetry, known_models=["bench"]))
        gw_runner, gw = await _serve(app, **RUNNER_KWARGS)
    runners.append(gw_runner)
    payload = _payload(args.stream)
    conns: dict[int, _Conn] = {}
    for port in (up, gw):
        _, conns[port] = await loop.create_connection(_Conn, "127.0.0.1", port)

    async def batch(port: int) -> float:
        raw = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        ).encode() + payload
        conn, spent, n = conns[port], 0.0, int(args.requests)
        for _ in range(n):
            if args.gap:
                await asyncio.sleep(args.gap)
            t0 = time.process_time()
            status, _body = await conn.request(raw)
            spent += time.process_time() - t0
            if status != 200:
                raise RuntimeError(f"HTTP {status} from port {port}")
        return spent / n

    try:
        for port in (up, gw):  # warm-up
            await batch(port)
        gc.collect()
        gc.freeze()
        diffs = []
        for _ in range(args.batches):
            direct = await batch(up)
            diffs.append((await batch(gw) - direct) * 1e6)
        return diffs
    finally:
        for c in conns.values():
            if c.transport is not None:
                c.transport.close()
        await session.close()
        for r in reversed(runners):
            await r.cleanup()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stream", action="store_true", help="streamed answers (8 events, usage, [DONE])")
    ap.add_argument("--policy", default="always-base", help="routing policy (default always-base)")
    ap.add_argument("--minimal", action="store_true", help="a bare aiohttp forwarder instead of specgate")
    ap.add_argument("--batches", type=int, default=30, help="batch pairs (direct, proxied); default 30")
    ap.add_argument("--requests", type=int, default=100, help="requests per batch; default 100")
    ap.add_argument("--gap", type=float, default=0.0, help="seconds idle before each request; default 0")
    args = ap.parse_args()
    diffs = sorted(uvloop.run(run(args)))
    q = statistics.quantiles(diffs, n=4)
    what = "minimal aiohttp forwarder" if args.minimal else "specgate"
    mode = "stream" if args.stream else "non-stream"
    print(
        f"{what}, {mode}: added CPU per request {statistics.median(diffs):.0f} µs "
        f"(quartiles {q[0]:.0f}-{q[2]:.0f}, {args.batches} batches of {args.requests})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
