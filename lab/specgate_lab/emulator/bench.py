"""Measure the streamed SSE events/s one emulator process sustains on one CPU core.

    python -m specgate_lab.emulator.bench --concurrency 256 --duration 20

Starts ``specgate emulate`` (a plain engine, so one event = one token; or
``--spec`` for the n-gram engine) with a very fast emulated GPU, pinned to one core
with ``taskset`` when available,
drives it with streaming clients from this process (pinned to another core), and
prints events/s, tokens/s and the emulator's CPU use. When the emulator saturates
its core, emulated time falls behind the wall clock: use ``specgate emulate
--time-scale`` > 1 for load tests that would otherwise exceed the figure printed here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import sys
import time

import aiohttp

NGRAM = '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_min":2,"prompt_lookup_max":5}'
PROMPT = (
    "Refactor this function and return the full code unchanged otherwise:\n```python\n"
    + "\n".join(f"def f{i}(x):\n    return x * {i} + helper(x, {i})\n" for i in range(30))
    + "```"
)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (``/proc/PID/stat``: psutil would read the same
    fields, but it is a development dependency and this runs on the runtime install)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


async def _client(
    session: aiohttp.ClientSession, url: str, deadline: float, counts: list[int], max_tokens: int
) -> None:
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "stream": True, "temperature": 0}
    while time.monotonic() < deadline:
        async with session.post(url + "/v1/completions", json=body) as r:
            async for data in r.content.iter_any():
                counts[0] += data.count(b"data: {")
                if time.monotonic() >= deadline:
                    return


async def run(args: argparse.Namespace) -> dict[str, float]:
    cmd = [
        sys.executable,
        "-m",
        "gateway",
        "emulate",
        "--port",
        "0",
        "--max-num-seqs",
        str(args.max_num_seqs),
    ]
    cmd += ["--time-scale", str(args.time_scale), "--num-gpu-blocks-override", "1000000"]
    if args.spec:
        cmd += ["--speculative-config", NGRAM]
    if shutil.which("taskset") and (os.cpu_count() or 1) > 1:
        cmd = ["taskset", "-c", str(args.emulator_cpu), *cmd]
        os.sched_setaffinity(0, {c for c in os.sched_getaffinity(0) if c != args.emulator_cpu} or {0})
    proc = await asyncio.create_subprocess_exec(*cmd, stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        m = re.search(r"http://[\d.]+:\d+", line)
        if not m:
            raise RuntimeError(f"emulator did not start: {line!r}")
        url = m.group(0)
        counts = [0, 0]
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None)) as s:
            # warm-up, then measure
            await asyncio.gather(
                *(
                    _client(s, url, time.monotonic() + 2, [0, 0], args.max_tokens)
                    for _ in range(args.concurrency)
                )
            )
            cpu0, t0 = _cpu_seconds(proc.pid), time.monotonic()
            deadline = t0 + args.duration
            await asyncio.gather(
                *(_client(s, url, deadline, counts, args.max_tokens) for _ in range(args.concurrency))
            )
            wall = time.monotonic() - t0
            cpu = _cpu_seconds(proc.pid) - cpu0
        return {
            "events_per_s": counts[0] / wall,
            "wall_s": wall,
            "emulator_cpu_s": cpu,
            "emulator_cpu_share": cpu / wall,
            "events_per_cpu_s": counts[0] / cpu if cpu else float("nan"),
        }
    finally:
        proc.terminate()
        await proc.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--duration", type=float, default=15.0)
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument(
        "--time-scale",
        type=float,
        default=0.02,
        help="emulated GPU time per wall second; the default makes the emulated GPU 50x faster, "
        "so the CPU (what this measures) is the limit",
    )
    p.add_argument("--spec", action="store_true", help="bench the n-gram speculative engine")
    p.add_argument("--emulator-cpu", type=int, default=0, help="core the emulator is pinned to")
    args = p.parse_args(argv)
    res = asyncio.run(run(args))
    kind = "ngram spec" if args.spec else "plain"
    print(
        f"{kind} engine, concurrency {args.concurrency}: {res['events_per_s']:.0f} SSE events/s "
        f"({res['emulator_cpu_share'] * 100:.0f}% of one core; "
        f"{res['events_per_cpu_s']:.0f} events per CPU-second)"
    )
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
