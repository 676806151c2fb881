"""Open-loop load generator: Poisson arrivals of streaming chat requests over aiohttp.

Times are measured on the wall clock and divided by ``time_scale`` so that every figure
is in the emulator's time (``time_scale=4``: emulated time runs 4× slower than wall time).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp

from gateway.wire.sse import ChatStream
from specgate_lab.bench.stats import RequestRecord
from specgate_lab.workload import TemperatureDist, sample, to_openai_body

ROUTE_HEADER = "x-specgate-route"
ENGINE_HEADER = "x-specgate-engine"
REASON_HEADER = "x-specgate-reason"


@dataclass(frozen=True, slots=True)
class PointResult:
    records: list[RequestRecord]  # requests that arrived inside the measurement window
    window: tuple[float, float]  # (start, end) of the measurement window, emulated seconds
    unfinished: int  # window requests still running when the drain timeout hit
    tokens_in_window: float  # output tokens delivered inside the window (streams spread evenly)


async def stream_chat(
    session: aiohttp.ClientSession,
    url: str,
    body: Mapping[str, object],
    rec: RequestRecord,
    t_origin: float,
    time_scale: float,
) -> None:
    """Send one streaming chat request and fill ``rec`` (times in emulated seconds since
    ``t_origin``): status, route headers, TTFT, chunks, output tokens (the final usage
    chunk, else the content chunks), E2E, and ``ok`` or ``error``."""
    start = time.perf_counter()

    def now() -> float:
        return (time.perf_counter() - start) / time_scale

    rec.start = (start - t_origin) / time_scale
    try:
        async with session.post(
            url, data=json.dumps(body), headers={"content-type": "application/json"}
        ) as resp:
            rec.status = resp.status
            rec.route = resp.headers.get(ROUTE_HEADER, "")[:16]
            rec.reason = resp.headers.get(REASON_HEADER, "")[:64]
            rec.engine = resp.headers.get(ENGINE_HEADER, "")[:64]
            if resp.status != 200:
                text = await resp.text()
                raise RuntimeError(f"HTTP {resp.status}: {text[:200]}")
            stream = ChatStream()
            async for data in resp.content.iter_any():
                if stream.feed(data) and rec.ttft is None:
                    rec.ttft = now()
                if stream.done:
                    break
            stream.finish()
        rec.chunks = stream.output_chunks
        rec.output_tokens = stream.output_tokens
        rec.ok = True
    except asyncio.CancelledError:
        rec.error = "cancelled: still running at the end of the drain"
        raise
    except Exception as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        rec.e2e = now()


async def run_point(
    base_url: str,
    model: str,
    qps: float,
    *,
    duration_s: float,
    warmup_s: float = 0.0,
    mix: str | Mapping[str, float] | None = None,
    temperature: str | float | TemperatureDist = "default",
    seed: int = 1,
    time_scale: float = 1.0,
    max_tokens_cap: int = 512,
    drain_s: float = 120.0,
    request_timeout_s: float = 600.0,
) -> PointResult:
    """Offer ``qps`` (emulated req/s) for ``warmup_s + duration_s`` emulated seconds.

    Requests arriving during the warm-up are sent but not reported. After the last
    arrival, waits up to ``drain_s`` emulated seconds for the window's requests to finish.
    """
    if qps <= 0 or duration_s <= 0 or time_scale <= 0:
        raise ValueError("qps, duration_s and time_scale must be > 0")
    rng = random.Random(seed)
    temps = TemperatureDist.parse(temperature)
    url = base_url.rstrip("/") + "/v1/chat/completions"
    timeout = aiohttp.ClientTimeout(total=request_timeout_s * time_scale, sock_connect=10)
    conn = aiohttp.TCPConnector(limit=0, force_close=False)
    w0, w1 = warmup_s, warmup_s + duration_s
    sent: list[tuple[RequestRecord, asyncio.Task[None]]] = []
    window: list[tuple[RequestRecord, asyncio.Task[None]]] = []
    tasks: set[asyncio.Task[None]] = set()
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        t_origin = time.perf_counter()
        t_next = rng.expovariate(qps)
        while t_next < w1:
            delay = t_origin + t_next * time_scale - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            req = sample(rng, mix, temps, max_tokens_cap=max_tokens_cap)
            rec = RequestRecord(0.0, req.kind, req.subkind, req.temperature, False)
            rec.lateness = max(0.0, (time.perf_counter() - t_origin) / time_scale - t_next)
            task = asyncio.create_task(
                stream_chat(session, url, to_openai_body(req, model), rec, t_origin, time_scale)
            )
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            sent.append((rec, task))
            if t_next >= w0:
                window.append((rec, task))
            t_next += rng.expovariate(qps)
        pending = [t for _, t in window if not t.done()]
        if pending:
            _, still = await asyncio.wait(pending, timeout=drain_s * time_scale)
        else:
            still = set()
        for t in list(tasks):
            t.cancel()
        for t in list(tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await t
    records = [r for r, t in window if t not in still]
    # Tokens delivered inside the window, also by requests that arrived during the warm-up.
    tokens = sum(tokens_within(r, w0, w1) for r, t in sent if t not in still)
    return PointResult(records, (w0, w1), len(still), tokens)


def tokens_within(r: RequestRecord, w0: float, w1: float) -> float:
    """Output tokens of ``r`` delivered inside [w0, w1], spreading them evenly over the stream."""
    if not r.ok or r.output_tokens <= 0 or r.e2e is None:
        return 0.0
    a = r.start + (r.ttft if r.ttft is not None else r.e2e)
    b = r.start + r.e2e
    if b <= a:
        return float(r.output_tokens) if w0 <= b <= w1 else 0.0
    overlap = max(0.0, min(b, w1) - max(a, w0))
    return r.output_tokens * overlap / (b - a)
