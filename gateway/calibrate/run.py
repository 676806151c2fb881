"""Scrape an engine pair while traffic runs, and (optionally) drive that traffic.

:func:`collect` scrapes both engines' ``/metrics`` every ``interval_s`` for the length of
a run. With ``drive`` it also sends the traffic a fit needs: each engine *alone* (so the
shared GPU runs one engine's steps only), at each concurrency of ``levels`` in turn,
``/v1/completions`` requests of ``max_tokens`` tokens with ``ignore_eos`` (vLLM's
extension: every answer has the same length) that ask for an edit of pasted code; the
workers' first answers are staggered in length so that the load holds instead of coming
in waves.
Without ``drive`` the run only watches traffic that something else sends (the fit then
keeps the windows in which one engine ran alone).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp

from gateway.calibrate.windows import Scrape, parse_scrape

# An edit of pasted code: answers copy their prompt, so n-gram and suffix speculators
# draft (an open question would leave a prompt-lookup engine with no drafts to verify).
PROMPT = """Rewrite the following function with type hints, and return the whole code unchanged otherwise:

```python
def merge_windows(windows, min_steps, max_spread):
    merged = []
    for window in windows:
        if window.steps < min_steps:
            continue
        if merged and merged[-1].end == window.start and window.load <= max_spread * merged[-1].load:
            last = merged.pop()
            window = Window(last.start, window.end, last.steps + window.steps, max(last.load, window.load))
        merged.append(window)
    return merged


def mean_step(windows):
    steps = sum(window.steps for window in windows)
    busy = sum(window.end - window.start for window in windows)
    return busy / steps if steps else None
```
"""


@dataclass
class Collected:
    spec: list[Scrape] = field(default_factory=list)
    base: list[Scrape] = field(default_factory=list)
    requests: int = 0
    errors: int = 0


async def _scrape(session: aiohttp.ClientSession, url: str, t: float, model: str | None) -> Scrape:
    async with session.get(f"{url}/metrics") as resp:
        resp.raise_for_status()
        return parse_scrape(await resp.text(), t, model)


async def _served_model(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(f"{url}/v1/models") as resp:
        resp.raise_for_status()
        data = await resp.json()
    return str(data["data"][0]["id"])


async def _worker(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    max_tokens: int,
    stop: asyncio.Event,
    out: Collected,
    first_tokens: int | None = None,
) -> None:
    """Requests back to back until ``stop``; the first of ``first_tokens`` tokens, so that
    workers started together do not finish together (a load that comes in waves)."""
    body = {"model": model, "prompt": PROMPT, "ignore_eos": True, "temperature": 0}
    body["max_tokens"] = first_tokens or max_tokens
    while not stop.is_set():
        try:
            async with session.post(f"{url}/v1/completions", json=body) as resp:
                await resp.read()
                out.requests += 1
                if resp.status != 200:
                    out.errors += 1
            body["max_tokens"] = max_tokens
        except aiohttp.ClientError:
            out.errors += 1
            await asyncio.sleep(0.1)  # an engine that refuses: do not spin


async def collect(
    spec_url: str,
    base_url: str,
    *,
    duration_s: float,
    interval_s: float = 0.5,
    drive: bool = False,
    levels: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
    max_tokens: int = 256,
    spec_model: str | None = None,
    base_model: str | None = None,
) -> Collected:
    """Scrapes of both engines over ``duration_s`` (driving them in turn with ``drive``)."""
    out = Collected()
    spec_url, base_url = spec_url.rstrip("/"), base_url.rstrip("/")
    conn = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=max(60.0, duration_s))
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
        stop_scraping = asyncio.Event()

        async def scraper() -> None:
            t0 = time.monotonic()
            while not stop_scraping.is_set():
                t = time.monotonic() - t0
                s, b = await asyncio.gather(
                    _scrape(session, spec_url, t, spec_model), _scrape(session, base_url, t, base_model)
                )
                out.spec.append(s)
                out.base.append(b)
                try:
                    await asyncio.wait_for(stop_scraping.wait(), interval_s)
                except TimeoutError:
                    pass

        task = asyncio.create_task(scraper())
        try:
            if drive:
                stages = [(base_url, base_model), (spec_url, spec_model)]
                dwell = duration_s / (len(stages) * len(levels))
                for url, model in stages:
                    name = model or await _served_model(session, url)
                    for c in levels:
                        stop = asyncio.Event()
                        workers = [
                            asyncio.create_task(
                                _worker(
                                    session,
                                    url,
                                    name,
                                    max_tokens,
                                    stop,
                                    out,
                                    max(1, max_tokens * (i + 1) // c),
                                )
                            )
                            for i in range(c)
                        ]
                        await asyncio.sleep(dwell)
                        stop.set()
                        await asyncio.gather(*workers)  # the level drains before the next
            else:
                await asyncio.sleep(duration_s)
        finally:
            stop_scraping.set()
            await task
    return out
