"""Gateway replicas in a benchmark: their routing modes and the pair's engines, sampled.

While a scenario runs through N gateway replicas, :func:`watch` polls each replica's
``GET /admin/state`` (the model's mode) and each engine's ``/metrics`` (vLLM's
``num_requests_running``), and :func:`agreement` reduces the samples to the two figures
that show a split pair: the share of samples in which the replicas' modes differ, and the
share in which both engines of the pair had requests running (each request then waits
for both engines' steps).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

import aiohttp

_RUNNING = re.compile(r"^vllm:num_requests_running(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.M)


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # seconds on the scenario clock
    modes: tuple[str | None, ...]  # each replica's mode of the model (None: unreadable)
    running: tuple[float, ...]  # requests running on each engine


def mode_of(state: object, model: str) -> str | None:
    """The model's routing mode in a ``GET /admin/state`` body."""
    with contextlib.suppress(KeyError, TypeError):
        mode = state["models"][model]["policy_state"]["mode"]  # type: ignore[index]
        return mode if isinstance(mode, str) else None
    return None


def running_of(metrics_text: str) -> float:
    """vLLM's ``num_requests_running`` gauge on a ``/metrics`` page (0 when absent)."""
    m = _RUNNING.search(metrics_text)
    return float(m.group(1)) if m else 0.0


async def watch(
    session: aiohttp.ClientSession,
    gateways: Sequence[str],
    engines: Sequence[str],
    model: str,
    out: list[Sample],
    *,
    t_origin: float,
    scale: float,
    interval_s: float = 0.25,
) -> None:
    """Sample until cancelled (``t_origin``: ``time.perf_counter()`` at the scenario's
    start, ``scale``: wall seconds per scenario second)."""
    timeout = aiohttp.ClientTimeout(total=2.0)

    async def get(url: str) -> str | None:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.get(url, timeout=timeout) as r:
                return await r.text() if r.status == 200 else None
        return None

    while True:
        at = (time.perf_counter() - t_origin) / scale
        states = await asyncio.gather(*(get(g + "/admin/state") for g in gateways))
        pages = await asyncio.gather(*(get(e + "/metrics") for e in engines))
        modes = tuple(mode_of(json.loads(s), model) if s else None for s in states)
        out.append(Sample(at, modes, tuple(running_of(p or "") for p in pages)))
        await asyncio.sleep(interval_s)


def agreement(samples: Sequence[Sample], t0: float = 0.0) -> dict[str, float]:
    """``modes_differ`` and ``both_engines_busy`` over the samples from ``t0`` on."""
    xs = [s for s in samples if s.at >= t0]
    if not xs:
        return {"modes_differ": 0.0, "both_engines_busy": 0.0}
    differ = sum(1 for s in xs if len(set(s.modes)) > 1)
    both = sum(1 for s in xs if len(s.running) >= 2 and all(r > 0 for r in s.running))
    return {"modes_differ": differ / len(xs), "both_engines_busy": both / len(xs)}


def switch_spread(samples: Sequence[Sample], t0: float = 0.0) -> float | None:
    """The largest gap between replicas switching mode for the same change: the k-th
    switch of every replica is taken as one change (seconds; None when the replicas did
    not switch equally often, 0.0 when none switched)."""
    xs = [s for s in samples if s.at >= t0 and None not in s.modes]
    if not xs:
        return None
    n = len(xs[0].modes)
    flips: list[list[float]] = [[] for _ in range(n)]
    for a, b in itertools.pairwise(xs):
        for i in range(n):
            if a.modes[i] != b.modes[i]:
                flips[i].append(b.at)
    if len({len(f) for f in flips}) != 1:
        return None
    return max((max(ts) - min(ts) for ts in zip(*flips, strict=True)), default=0.0)
