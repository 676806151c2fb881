"""End to end with the adaptive policy: OpenAI SDK → gateway (scrapers on) → emulated pair.

The emulated engines share one device timeline; the gateway scrapes their real
``/metrics`` pages, and the adaptive core decides per request from those views.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer

from gateway.api.app import build_app
from gateway.api.state import STATE
from gateway.config import GatewayConfig

pytestmark = pytest.mark.timeout(90)

CODE = "".join(f"def f{i}(a, b):\n    return a * {i} + b - helper(a)\n\n" for i in range(12))
EDIT = [
    {
        "role": "user",
        "content": "Rename helper to assist, return the full file unchanged otherwise:\n"
        f"```python\n{CODE}```",
    }
]
CHAT = [{"role": "user", "content": "Write me a poem about the sea."}]


async def _wait_scraped(app_state: object) -> None:
    """Until every engine of the model has a successful scrape (polls the runtime state)."""
    deadline = time.monotonic() + 10.0
    rt = app_state.models["qwen3-8b"]  # type: ignore[attr-defined]
    while not all(e.scrape is not None and e.scrape.ok for e in rt.engines.values()):
        assert time.monotonic() < deadline, "engines were never scraped"
        await asyncio.sleep(0.05)


def _spec_samples(state: object) -> int:
    """``measured_vs_model.spec.samples`` wherever it sits in the admin state."""
    if isinstance(state, dict):
        mvm = state.get("measured_vs_model")
        if isinstance(mvm, dict):
            return int(mvm["spec"]["samples"])
        return max((_spec_samples(v) for v in state.values()), default=0)
    if isinstance(state, list):
        return max((_spec_samples(v) for v in state), default=0)
    return 0


async def test_adaptive_routes_through_scraped_emulated_pair(
    pair_config: Callable[..., GatewayConfig],
) -> None:
    cfg = pair_config(**{"models.0.routing.policy": "adaptive"})
    app = build_app(cfg)
    gw = TestServer(app)
    await gw.start_server()
    client = await asyncio.to_thread(
        openai.AsyncOpenAI, base_url=str(gw.make_url("/v1")), api_key="unused", max_retries=0
    )

    async def ask(messages: Any, temperature: float, max_tokens: int) -> Any:
        return await client.chat.completions.with_raw_response.create(
            model="qwen3-8b", messages=messages, temperature=temperature, max_tokens=max_tokens
        )

    try:
        await _wait_scraped(app[STATE])
        edit = await ask(EDIT, 0.0, 64)
        assert edit.headers["x-specgate-route"] == "spec"
        # A fresh gateway has measured no acceptance yet: the reason says it went on the prior.
        assert edit.headers["x-specgate-reason"] == "prior"
        assert edit.parse().choices[0].message.content
        # Its outcome was learned: the same kind of request is now routed on what was measured;
        # sent alone, it finds the pair idle and takes the engine fastest for it.
        edit = await ask(EDIT, 0.0, 64)
        assert edit.headers["x-specgate-route"] == "spec"
        assert edit.headers["x-specgate-reason"] == "idle_pair"

        chat = await ask(CHAT, 1.0, 16)
        # Open chat at T=1 gains nothing from speculation: alone on the pair, it goes plain.
        assert chat.headers["x-specgate-route"] == "base"
        assert chat.headers["x-specgate-reason"] in ("idle_pair", "prior")

        async with aiohttp.ClientSession() as s, s.get(gw.make_url("/admin/state")) as r:
            assert r.status == 200
            state = await r.json()
        text = str(state)
        for key in ("break_even_tokens_per_step", "recent_decisions", "live_acceptance_ratio", "mode"):
            assert key in text
        # A streamed edit runs alone on spec: its measured time per token goes back against
        # the model's prediction (learned from after the response ends; a non-streamed
        # answer arrives whole and has no time per token to measure).
        stream = await client.chat.completions.create(
            model="qwen3-8b",
            messages=EDIT,
            temperature=0,
            max_tokens=64,
            stream=True,  # type: ignore[arg-type]
        )
        pieces = [
            c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content
        ]
        assert len(pieces) > 1
        deadline = time.monotonic() + 10.0
        while _spec_samples(state) < 1:
            assert time.monotonic() < deadline, "no measurement reached the policy"
            await asyncio.sleep(0.05)
            async with aiohttp.ClientSession() as s, s.get(gw.make_url("/admin/state")) as r:
                state = await r.json()
    finally:
        await client.close()
        await gw.close()
