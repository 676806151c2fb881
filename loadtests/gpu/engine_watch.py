"""What the engines did during a slot: their own /metrics, sampled every second.

The gateway's view of an engine (its scrape windows) is what routing reads; this is the
harness's independent record, for the questions a slot's latency alone cannot answer:
did the engine preempt (a pair halves each engine's KV cache), how full was its cache,
how long was its queue, how many prompt tokens did it prefill. One row per engine and
sample in ``<slot>-engines.jsonl``; :func:`summarize` reduces them to a row per engine.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import aiohttp

from gateway.engines.parse import parse_metrics

FIELDS = ("running", "waiting", "kv_usage", "preemptions", "prompt_tokens", "generation_tokens")
COUNTERS = ("preemptions", "prompt_tokens", "generation_tokens")


async def sample(session: aiohttp.ClientSession, url: str, served: str) -> dict[str, float | None]:
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    s = parse_metrics(text, served)
    return {f: getattr(s, f) for f in FIELDS}


async def watch(engines: dict[str, tuple[str, str]], path: Path, every_s: float = 1.0) -> None:
    """Append a row per engine (``name -> (url, served model name)``) to ``path`` every
    ``every_s`` seconds until cancelled; a failed sample is a row with ``error``."""
    t0 = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as s:
        while True:
            rows = []
            for name, (url, served) in engines.items():
                row: dict[str, Any] = {"t": round(time.monotonic() - t0, 2), "engine": name}
                try:
                    row.update(await sample(s, url, served))
                except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                    row["error"] = repr(exc)
                rows.append(row)
            with path.open("a", encoding="utf-8") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in rows)
            await asyncio.sleep(every_s)


def summarize(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """Per engine: the counters' increase over the samples (preemptions, prompt and
    generation tokens), the largest queue, batch and KV-cache use seen, and the samples."""
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
        out[name] = o
    return out


def load(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def table_md(per_slot: dict[str, dict[str, dict[str, float | None]]]) -> str:
    """A markdown table: one row per (slot, engine)."""

    def f(v: float | None, nd: int = 0) -> str:
        return "" if v is None else f"{v:.{nd}f}"

    head = (
        "| slot | engine | preemptions | max waiting | max running | max KV use | prompt tokens | generated |"
    )
    lines = [
        head,
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for slot, engines in per_slot.items():
        for name, o in engines.items():
            lines.append(
                f"| {slot} | {name} | {f(o['preemptions'])} | {f(o['max_waiting'])} | "
                f"{f(o['max_running'])} | {f(o['max_kv_usage'], 3)} | {f(o['prompt_tokens'])} | "
                f"{f(o['generation_tokens'])} |"
            )
    return "\n".join(lines) + "\n"
