"""A thinking model's answer, moved at any point, is the unmoved answer: the OpenAI SDK →
the gateway → two emulated engines with vLLM's qwen3 reasoning parser (real sockets,
temperature 0). Moves are forced with ``POST /admin/drain {"engine", "draining", "move"}``
at chosen and at random points of the stream: mid-reasoning (the stream moves once its
content begins), at the think boundary, mid-content (the prompt quotes accented and
Japanese text, so the seams fall among multi-byte characters), and after the last token
(nothing left to move). The client's reasoning + content and usage must equal the unmoved
answer's, within ``max_tokens``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.api.app import build_app
from gateway.routing.static import FixedPolicy
from gateway.routing.types import Route
from gateway.telemetry import build_telemetry
from specgate_lab.emulator.launch import EmulatorGroup, pair_launches, start_group
from tests.conftest import gateway_config_for

pytestmark = pytest.mark.timeout(240)


def doc(n: int) -> str:
    return "Summarise, quoting it: " + " ".join(
        f"Le café naïve numéro {i} sert 日本語のテキスト et des crêpes à Zürich." for i in range(n)
    )


RANDOM_POINTS = 3  # hypothesis examples per engine setting, beside the chosen points


@dataclass
class Got:
    reasoning: str = ""
    content: str = ""
    kinds: list[str] = field(default_factory=list)  # per chunk: "r", "c", "" (role, finish, usage)
    finishes: list[str] = field(default_factory=list)
    usage: Any = None
    drained: dict[str, Any] = field(default_factory=dict)


@pytest.fixture(
    # (reasoning field, parser mode, max_tokens, the question): the second answer is cut by
    # max_tokens (363 tokens unbounded), with enough left at its think boundary to move
    params=[("reasoning_content", "generated-only", 400, doc(3)), ("reasoning", "prompt-aware", 320, doc(2))],
    ids=["reasoning_content-generated-only", "reasoning-prompt-aware-max320"],
)
async def setting(request: pytest.FixtureRequest) -> AsyncIterator[tuple[EmulatorGroup, int, str]]:
    name, mode, max_tokens, question = request.param
    group = await start_group(
        pair_launches(
            port_spec=0,
            port_base=0,
            reasoning_parser="qwen3",
            reasoning_field=name,
            reasoning_parser_mode=mode,
        ),
        time_scale=1.0,  # real time: a move lands mid-stream
    )
    try:
        yield group, max_tokens, question
    finally:
        await group.stop()


@contextlib.asynccontextmanager
async def gateway(group: EmulatorGroup) -> AsyncIterator[tuple[str, openai.AsyncOpenAI]]:
    tel = build_telemetry({"tracing": "off", "process_metrics": False}, known_models=["qwen3-8b"])
    policy = FixedPolicy(Route.SPEC)
    gw = TestServer(build_app(gateway_config_for(group), telemetry=tel, policies={"qwen3-8b": policy}))
    await gw.start_server()
    client = await asyncio.to_thread(
        openai.AsyncOpenAI, base_url=str(gw.make_url("/v1")), api_key="unused", max_retries=0
    )
    try:
        yield str(gw.make_url("")).rstrip("/"), client
    finally:
        await client.close()
        await gw.close()


async def admin_drain(url: str, draining: bool) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/admin/drain", json={"engine": "spec0", "draining": draining, "move": draining}) as r,
    ):
        assert r.status == 200
        out: dict[str, Any] = await r.json()
        return out


async def answer(
    client: openai.AsyncOpenAI, url: str, question: str, max_tokens: int, drain_at: int | None
) -> Got:
    """Stream the question; with ``drain_at``, drain spec0 with ``move`` once the client has
    that many chunks (then undrain it for the next request)."""
    got = Got()
    stream = await client.chat.completions.create(
        model="qwen3-8b",
        messages=[{"role": "user", "content": question}],
        temperature=0,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        got.usage = chunk.usage or got.usage
        kind = ""
        for c in chunk.choices:
            extra = c.delta.model_extra or {}
            r = extra.get("reasoning_content") or extra.get("reasoning") or ""
            got.reasoning += r
            got.content += c.delta.content or ""
            kind = "c" if c.delta.content else "r" if r else ""
            if c.finish_reason:
                got.finishes.append(c.finish_reason)
        got.kinds.append(kind)
        if len(got.kinds) == drain_at:
            got.drained = await admin_drain(url, True)
    if drain_at is not None:
        await admin_drain(url, False)
    return got


async def moves(url: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        body = await r.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.splitlines()
        if line.startswith("specgate_stream_moves_total{") and 'result="moved"' in line
    )


async def test_a_reasoning_answer_moved_anywhere_is_the_unmoved_answer(
    setting: tuple[EmulatorGroup, int, str],
) -> None:
    group, max_tokens, question = setting
    async with gateway(group) as (url, client):
        ref = await answer(client, url, question, max_tokens, None)
        assert ref.reasoning and ref.content and ref.usage.completion_tokens <= max_tokens
        boundary = ref.kinds.index("c") + 1  # the chunk count with the first content
        last = max(i for i, k in enumerate(ref.kinds) if k) + 1  # ... with the last token

        def check(point: int, got: Got) -> None:
            assert (got.reasoning, got.content) == (ref.reasoning, ref.content), point
            assert got.finishes == ref.finishes, point
            assert got.usage.prompt_tokens == ref.usage.prompt_tokens, point
            assert got.usage.completion_tokens == ref.usage.completion_tokens <= max_tokens, point

        # chosen points: mid-reasoning, just before / at / after the think boundary, the last token
        for point in (3, boundary - 1, boundary, boundary + 3, last):
            got = await answer(client, url, question, max_tokens, point)
            check(point, got)
            assert got.drained["moving"] + got.drained["moving_later"] <= 1
            if point == 3:  # still thinking: it moves once its content begins
                assert got.drained == {**got.drained, "moving": 0, "moving_later": 1}
            if point == last:  # the finish went with the last token: nothing to move
                assert got.drained["moving"] == got.drained["moving_later"] == 0
        # the stream still thinking at its drain moves at its first content; whether the
        # later ones move depends on how far the gateway is ahead of the client (the answer is
        # the same either way: that is the property)
        assert await moves(url) >= 1

        loop = asyncio.get_running_loop()

        def run(point: int) -> Got:
            return asyncio.run_coroutine_threadsafe(
                answer(client, url, question, max_tokens, point), loop
            ).result(60)

        @settings(
            max_examples=RANDOM_POINTS,
            derandomize=True,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(st.integers(1, len(ref.kinds)))
        def prop(point: int) -> None:
            check(point, run(point))

        await asyncio.to_thread(prop)
