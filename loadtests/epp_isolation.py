#!/usr/bin/env python3
"""Where should the EPP's frame handling run so that a flood cannot starve the HTTP gateway?

Measures an aiohttp ``/health`` endpoint's latency (from a client in another process) while
CPU-bound Python work stands in for an EPP connection being flooded, three ways:

- ``idle``: no such work (the reference);
- ``thread``: the work on its own thread (as an EPP listener on its own thread and event
  loop would run it): the GIL is shared, and the main loop, woken by the socket, must win it
  back from a thread that never blocks (the interpreter hands it over every
  ``sys.getswitchinterval()``, 5 ms);
- ``slices``: the work on the gateway's loop in slices of ``--slice-ms`` (what the EPP's
  listener does): between slices the loop runs everything else that is ready.

    python loadtests/epp_isolation.py [--requests 400] [--slice-ms 2] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from aiohttp import web


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def client(port: int, n: int) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        conn.request("GET", "/health")
        conn.getresponse().read()
        lat.append(time.perf_counter() - t)
        time.sleep(0.005)
    print(json.dumps(lat))


async def scenario(name: str, a: argparse.Namespace) -> dict[str, float | str]:
    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/health", health)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    stop = threading.Event()
    loop = asyncio.get_running_loop()
    if name == "thread":

        def busy() -> None:
            while not stop.is_set():
                _spin(0.01)

        threading.Thread(target=busy, daemon=True).start()
    elif name == "slices":

        def slice_() -> None:
            if not stop.is_set():
                _spin(a.slice_ms / 1000)
                loop.call_soon(slice_)

        loop.call_soon(slice_)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--client", str(port), "--requests", str(a.requests), stdout=subprocess.PIPE
    )
    out, _ = await proc.communicate()
    stop.set()
    await runner.cleanup()
    lat = sorted(json.loads(out))
    q = lambda p: 1e3 * lat[min(len(lat) - 1, int(p * len(lat)))]  # noqa: E731
    return {"scenario": name, "p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": 1e3 * lat[-1]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--slice-ms", type=float, default=2.0)
    p.add_argument("--client", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    if a.client is not None:
        client(a.client, a.requests)
        return 0
    rows = [asyncio.run(scenario(name, a)) for name in ("idle", "thread", "slices")]
    for r in rows:
        print(
            f"{r['scenario']:>7}: /health p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
            f"max {r['max_ms']:.2f} ms"
        )
    if a.out:
        Path(a.out).write_text(json.dumps({"command": " ".join(sys.argv), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
