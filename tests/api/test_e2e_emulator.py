"""End to end: OpenAI SDK → gateway (scraping on) → emulated vLLM pair on one device timeline."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestServer

from gateway.api.app import build_app
from gateway.api.state import STATE
from gateway.config import GatewayConfig
from gateway.routing.static import TemperaturePolicy
from gateway.routing.types import Decision, ModelView, Outcome, RequestFeatures

pytestmark = pytest.mark.timeout(90)

CODE = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n"
EDIT = [
    {
        "role": "user",
        "content": f"Add type hints, return the full file unchanged otherwise:\n```python\n{CODE}```",
    }
]


@dataclass
class Recorder:
    inner: TemperaturePolicy = field(default_factory=TemperaturePolicy)
    name: str = "recorder"
    outcomes: list[Outcome] = field(default_factory=list)

    def decide(self, features: RequestFeatures, view: ModelView, now: float) -> Decision:
        return self.inner.decide(features, view, now)

    def observe(self, outcome: Outcome, now: float) -> None:
        self.outcomes.append(outcome)

    def snapshot(self) -> dict[str, object]:
        return {"outcomes": len(self.outcomes)}


async def test_sdk_through_gateway_to_emulated_pair(pair_config: Callable[..., GatewayConfig]) -> None:
    cfg = pair_config()
    recorder = Recorder()
    gw = TestServer(build_app(cfg, policies={"qwen3-8b": recorder}))
    await gw.start_server()
    client = await asyncio.to_thread(
        openai.AsyncOpenAI, base_url=str(gw.make_url("/v1")), api_key="unused", max_retries=0
    )
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model="qwen3-8b",
            messages=EDIT,  # type: ignore[arg-type]
            temperature=0,
            max_tokens=48,
            stream=True,
        )
        assert raw.headers["x-specgate-route"] == "spec"
        stream = raw.parse()
        text = ""
        async for chunk in stream:
            assert chunk.model == "qwen3-8b"
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
        assert text

        plain = await client.chat.completions.with_raw_response.create(
            model="qwen3-8b",
            messages=[{"role": "user", "content": "Tell me a story."}],
            temperature=0.9,
            max_tokens=16,
        )
        assert plain.headers["x-specgate-route"] == "base"
        assert plain.parse().choices[0].message.content

        # min_p never reaches the speculative engine, even when the client forces it
        forced = await client.chat.completions.with_raw_response.create(
            model="qwen3-8b",
            messages=EDIT,  # type: ignore[arg-type]
            temperature=0,
            max_tokens=8,
            extra_body={"min_p": 0.1},
            extra_headers={"x-specgate-route": "spec"},
        )
        assert forced.headers["x-specgate-route"] == "base"
        assert forced.headers["x-specgate-reason"] == "refused_params"

        # logprobs pass through as the engine wrote them, streamed and not
        ask: dict[str, Any] = {
            "model": "qwen3-8b",
            "messages": EDIT,
            "temperature": 0,
            "max_tokens": 12,
            "logprobs": True,
        }
        scored = await client.chat.completions.create(**ask, top_logprobs=2)
        content = scored.choices[0].logprobs.content  # type: ignore[union-attr]
        assert content and "".join(e.token for e in content) == scored.choices[0].message.content
        assert all(len(e.top_logprobs) == 2 for e in content)
        scored_stream = await client.chat.completions.create(**ask, stream=True)
        tokens = [
            e.token
            async for c in scored_stream
            if c.choices and c.choices[0].logprobs
            for e in c.choices[0].logprobs.content or []
        ]
        assert "".join(tokens) == scored.choices[0].message.content  # T=0: the same answer

        # learning saw the speculative answer with vLLM's per-request acceptance metrics
        spec_outcome = recorder.outcomes[0]
        assert spec_outcome.route.value == "spec" and spec_outcome.ok
        assert spec_outcome.completion_tokens > 0
        assert spec_outcome.reported_mean_acceptance_length is not None

        # the scraper filled the engine stats the router reads
        state = gw.app[STATE]
        spec_rt = state.models["qwen3-8b"].engines["spec0"]
        for _ in range(100):
            scrape = spec_rt.scrape
            if scrape is not None and scrape.stats is not None and scrape.stats.acceptance_rate is not None:
                break
            await asyncio.sleep(0.05)
        assert spec_rt.scrape is not None and spec_rt.scrape.ok and spec_rt.scrape.stats is not None
        assert spec_rt.scrape.stats.acceptance_rate is not None
        view = state.models["qwen3-8b"].view(spec_rt.scrape.scraped_at)
        assert view.pairs[0].spec.stale is False and view.pairs[0].spec.method == "ngram"
    finally:
        await client.close()
        await gw.close()
