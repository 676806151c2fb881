#!/usr/bin/env python3
"""Does a huge prompt stall the gateway? ``/health`` latency while 8 MB prompts arrive.

Starts an emulated engine pair and ``specgate serve`` (separate processes, so the client
shares no loop with the gateway), polls ``GET /health`` every ``--health-every`` seconds for
``--seconds`` seconds, and posts ``--prompts`` single-message chat prompts of ``--mb`` MB
spread over that time. Prints the ``/health`` p50 / p99 / max and each prompt's status.
The prompt is far past the emulated model's context, so the engine refuses it at once
(400): what is measured is the gateway's own work on the body (read, parse, features,
forward), which every engine pays for no matter what it answers.

    python loadtests/big_prompts.py                 # three 8 MB prompts in 15 s
    python loadtests/big_prompts.py --prompts 0     # the baseline without them

Not a product component: a measurement only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import string
import subprocess
import sys
import time

import aiohttp


def prompt_body(mb: float, seed: int = 0) -> bytes:
    """A chat body whose one user message is ``mb`` MB of word-like text."""
    rnd = random.Random(seed)
    words = ["".join(rnd.choices(string.ascii_lowercase, k=rnd.randint(2, 9))) for _ in range(5000)]
    size = int(mb * 1_000_000)
    text = " ".join(rnd.choice(words) for _ in range(size // 5 + 1))[: size - 120]
    body = {"model": "qwen3-8b", "messages": [{"role": "user", "content": text}], "max_tokens": 16}
    return json.dumps(body).encode()


async def _wait_http(session: aiohttp.ClientSession, url: str, within_s: float = 60.0) -> None:
    deadline = time.monotonic() + within_s
    while True:
        try:
            async with session.get(url) as r:
                if r.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"{url} did not answer within {within_s:g} s")
        await asyncio.sleep(0.2)


async def measure(args: argparse.Namespace) -> dict[str, object]:
    gw = f"http://127.0.0.1:{args.port}"
    body = await asyncio.to_thread(prompt_body, args.mb)
    lat: list[float] = []
    statuses: list[int] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
        await _wait_http(s, f"{gw}/ready")

        async def poll(stop: float) -> None:
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                async with s.get(f"{gw}/health") as r:
                    await r.read()
                lat.append(time.perf_counter() - t0)
                await asyncio.sleep(args.health_every)

        async def post(delay: float) -> None:
            await asyncio.sleep(delay)
            hdrs = {"Content-Type": "application/json"}
            async with s.post(f"{gw}/v1/chat/completions", data=body, headers=hdrs) as r:
                await r.read()
                statuses.append(r.status)

        stop = time.monotonic() + args.seconds
        gap = args.seconds / max(1, args.prompts)
        await asyncio.gather(poll(stop), *(post(0.5 + i * gap) for i in range(args.prompts)))
    lat.sort()
    return {
        "prompts": args.prompts,
        "mb": args.mb,
        "statuses": statuses,
        "health_n": len(lat),
        "health_p50_ms": round(1000 * statistics.median(lat), 1),
        "health_p99_ms": round(1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))], 1),
        "health_max_ms": round(1000 * lat[-1], 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=3, help="big prompts sent over the run (default 3)")
    ap.add_argument("--mb", type=float, default=8.0, help="size of each prompt's body in MB (default 8)")
    ap.add_argument("--seconds", type=float, default=15.0, help="length of the run (default 15)")
    ap.add_argument("--health-every", type=float, default=0.02, help="seconds between /health polls")
    ap.add_argument("--port", type=int, default=22000, help="gateway port; the engines take the next two")
    args = ap.parse_args()
    spec, base = args.port + 1, args.port + 2
    py = sys.executable
    env = {
        **os.environ,
        "SPECGATE_MODELS__0__PAIRS__0__SPEC__URL": f"http://127.0.0.1:{spec}",
        "SPECGATE_MODELS__0__PAIRS__0__BASE__URL": f"http://127.0.0.1:{base}",
    }
    serve_flags = ("--max-body-bytes", "16000000")  # room for the prompts (the default is 8 MiB)
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    procs = [
        subprocess.Popen(
            [py, "-m", "gateway", "emulate", "--pair", "--spec-port", str(spec), "--base-port", str(base)],
            **quiet,  # type: ignore[call-overload]
        ),
        subprocess.Popen(
            [*(py, "-m", "gateway", "serve", "--port", str(args.port), "--no-scrape"), *serve_flags],
            env=env,
            **quiet,  # type: ignore[call-overload]
        ),
    ]
    try:
        print(json.dumps(asyncio.run(measure(args))))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
