"""What the engines did during a slot: their own /metrics and their processes' CPU,
sampled every second.

The gateway's view of an engine (its scrape windows) is what routing reads; this is the
harness's independent record, for the questions a slot's latency alone cannot answer:
did the engine preempt (a pair halves each engine's KV cache), how full was its cache,
how long was its queue, how many prompt tokens did it prefill, and how much CPU did its
processes (and the gateway's) burn: a host process at a whole core caps the engine,
whatever the GPU could do. One row per engine (or process) and sample in
``<slot>-engines.jsonl``; :func:`summarize` reduces them to a row per engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Iterable
from pathlib import Path
from typing import Any

import aiohttp

from gateway.engines.parse import parse_metrics
from specgate_lab.bench.procs import child_pids, process_cpu_s

FIELDS = ("running", "waiting", "kv_usage", "preemptions", "prompt_tokens", "generation_tokens")
COUNTERS = ("preemptions", "prompt_tokens", "generation_tokens")
# CPU seconds of a process (``cpu_top_s``: vLLM's API server, the gateway) and of its
# descendants (``cpu_sub_s``: vLLM's EngineCore, which schedules and drives the GPU)
CPU = ("cpu_top_s", "cpu_sub_s")


def cpu(pid: int) -> dict[str, float]:
    """``cpu_top_s`` and ``cpu_sub_s`` of a process tree (empty if the process is gone)."""
    top = process_cpu_s(pid)
    if top is None:
        return {}
    sub = sum(process_cpu_s(k) or 0.0 for k in child_pids(pid, recursive=True))
    return {"cpu_top_s": top, "cpu_sub_s": sub}


async def sample(session: aiohttp.ClientSession, url: str, served: str) -> dict[str, float | None]:
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    s = parse_metrics(text, served)
    return {f: getattr(s, f) for f in FIELDS}


async def watch(
    engines: dict[str, tuple[str, str]],
    path: Path,
    every_s: float = 1.0,
    pids: dict[str, int] | None = None,
) -> None:
    """Append a row per engine (``name -> (url, served model name)``) to ``path`` every
    ``every_s`` seconds until cancelled; a failed sample is a row with ``error``. ``pids``:
    processes whose CPU is read too (an engine's API server under the engine's name adds
    to the engine's row; others, e.g. ``gateway``, get rows of their own)."""
    t0 = time.monotonic()
    pids = pids or {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
        while True:
            rows = []
            for name, (url, served) in engines.items():
                row: dict[str, Any] = {"t": round(time.monotonic() - t0, 3), "engine": name}
                try:
                    row.update(await sample(s, url, served))
                except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    row["error"] = repr(exc)
                if name in pids:
                    row.update(cpu(pids[name]))
                rows.append(row)
            for name, pid in pids.items():
                if name not in engines:
                    rows.append({"t": round(time.monotonic() - t0, 3), "engine": name, **cpu(pid)})
            with path.open("a", encoding="utf-8") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in rows)
            await asyncio.sleep(every_s)


@contextlib.asynccontextmanager
async def watching(
    engines: dict[str, tuple[str, str]], path: Path, pids: dict[str, int] | None = None
) -> AsyncIterator[None]:
    """:func:`watch` for as long as the block runs."""
    task = asyncio.create_task(watch(engines, path, pids=pids))
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def summarize(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per engine: the counters' increase over the samples (preemptions, prompt and
    generation tokens), the largest queue, batch and KV-cache use seen, the CPU cores its
    processes used (``cpu_top``/``cpu_sub``: ``_mean`` over the slot, ``_max`` in its
    busiest interval), and the samples."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if "error" not in r:
            by.setdefault(r["engine"], []).append(r)
    out: dict[str, dict[str, float | None]] = {}
    for name, rs in by.items():
        rs.sort(key=lambda r: r["t"])
        o: dict[str, float | None] = {"samples": float(len(rs))}
        for c in COUNTERS:
            vals = [r[c] for r in rs if r.get(c) is not None]
            # a counter that went down is an engine restart: count from there
            o[c] = sum(max(0.0, b - a) for a, b in itertools.pairwise(vals)) if vals else None
        for g, key in (("waiting", "max_waiting"), ("running", "max_running"), ("kv_usage", "max_kv_usage")):
            vals = [r[g] for r in rs if r.get(g) is not None]
            o[key] = max(vals) if vals else None
        for c in CPU:
            pts = [(r["t"], r[c]) for r in rs if r.get(c) is not None]
            rates = [(b[1] - a[1]) / (b[0] - a[0]) for a, b in itertools.pairwise(pts) if b[0] > a[0]]
            span = pts[-1][0] - pts[0][0] if len(pts) > 1 else 0.0
            o[c[:-2] + "_mean"] = (pts[-1][1] - pts[0][1]) / span if span > 0 else None
            o[c[:-2] + "_max"] = max(rates) if rates else None
        out[name] = o
    return out


def load(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def table_md(per_slot: dict[str, dict[str, dict[str, float | None]]]) -> str:
    """A markdown table: one row per (slot, engine or process)."""

    def f(v: float | None, nd: int = 0) -> str:
        return "" if v is None else f"{v:.{nd}f}"

    lines = [
        "| slot | engine | preemptions | max waiting | max running | max KV use | prompt tokens | generated "
        "| CPU cores, process: mean / max | its children: mean / max |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for slot, engines in per_slot.items():
        for name, o in engines.items():
            g = o.get
            lines.append(
                f"| {slot} | {name} | {f(g('preemptions'))} | {f(g('max_waiting'))} | "
                f"{f(g('max_running'))} | {f(g('max_kv_usage'), 3)} | {f(g('prompt_tokens'))} | "
                f"{f(g('generation_tokens'))} | {f(g('cpu_top_mean'), 2)} / {f(g('cpu_top_max'), 2)} | "
                f"{f(g('cpu_sub_mean'), 2)} / {f(g('cpu_sub_max'), 2)} |"
            )
    return "\n".join(lines) + "\n"
