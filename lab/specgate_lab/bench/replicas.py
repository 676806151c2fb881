"""Gateway replicas in a benchmark: their routing modes and the pair's engines, sampled.

While a scenario runs through N gateway replicas, :func:`watch` polls each replica's
``GET /admin/state`` (the model's mode) and each engine's ``/metrics`` (vLLM's
``num_requests_running``) into :class:`~specgate_lab.sim.agreement.Sample` records, which
:mod:`specgate_lab.sim.agreement` reduces as it does the simulator's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Sequence

import aiohttp

from specgate_lab.sim.agreement import Sample

_RUNNING = re.compile(r"^vllm:num_requests_running(?:\{[^}]*\})? ([0-9.eE+-]+)$", re.M)


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
