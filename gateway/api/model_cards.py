"""``GET /v1/models``: the gateway's models, with what their engines report about them.

vLLM's model card carries ``max_model_len`` (the context window a client must fit in)
and ``root`` (the weights the engine serves, e.g. ``Qwen/Qwen3-8B``). The gateway lists
each model under its client-facing name (``id``) and keeps those engine fields:
``max_model_len`` is the smallest any of the model's engines reports (a request must fit
whichever engine it is routed to), ``root`` and ``parent`` are the engine's own (the
weights; both engines of a pair serve the same ones). An engine that does not answer is
skipped; when none answers the card has the OpenAI fields only. Engine cards are asked
for at most every :data:`CARDS_CACHE_S` seconds, with a short timeout.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from gateway.api.state import GatewayState
from gateway.engines.runtime import EngineRuntime

CARDS_CACHE_S = 10.0


async def _engine_card(st: GatewayState, rt: EngineRuntime, timeout_s: float) -> dict[str, Any] | None:
    headers = rt.config.auth_headers() or None
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        session = st.pool.control(rt.name)
        async with session.get(rt.config.url + "/v1/models", timeout=timeout, headers=headers) as resp:
            if resp.status != 200:
                return None
            body = await resp.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
        return None
    except KeyError:  # its pair left while the cards were being fetched (gateway.fleet)
        return None
    data = body.get("data") if isinstance(body, dict) else None
    for card in data if isinstance(data, list) else []:
        if isinstance(card, dict) and card.get("id") == rt.config.served_model_name:
            return card
    return None


def _merge(cards: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    lens = [
        c["max_model_len"]
        for c in cards
        if isinstance(c.get("max_model_len"), int) and not isinstance(c["max_model_len"], bool)
    ]
    if lens:
        out["max_model_len"] = min(lens)
    for key in ("root", "parent"):
        value = next((c[key] for c in cards if key in c and isinstance(c[key], str | None)), ...)
        if value is not ...:
            out[key] = value
    return out


async def engine_fields(st: GatewayState) -> dict[str, dict[str, Any]]:
    """Model name → the engine-reported fields of its card (cached for CARDS_CACHE_S)."""
    now = time.monotonic()
    cached = st.cards_cache
    if cached is not None and now - cached[0] <= CARDS_CACHE_S:
        return cached[1]
    timeout = min(2.0, st.config.scrape.timeout_s * 2)
    engines = [rt for m in st.models.values() for rt in m.engines.values()]
    cards = await asyncio.gather(*(_engine_card(st, rt, timeout) for rt in engines))
    by_engine = dict(zip((rt.name for rt in engines), cards, strict=True))
    fields = {
        name: _merge([c for e in m.engines if (c := by_engine.get(e)) is not None])
        for name, m in st.models.items()
    }
    st.cards_cache = (now, fields)
    return fields
