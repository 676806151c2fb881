"""A reasoning model's answer moved to the sibling engine: OpenAI SDK → gateway → two fake
engines that stream Qwen3-style reasoning (real sockets). The client must get the answer
it would have got unmoved, billed as unmoved, and the gateway's timings must see the
reasoning (each case is a row of the acceptance table this change answers)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import openai
import pytest

from gateway.api.state import STATE
from gateway.routing.static import FixedPolicy
from gateway.routing.types import Outcome, Route
from tests.proxy.fake_engine import FakeEngine
from tests.proxy.harness import Harness, harness

pytestmark = pytest.mark.timeout(60)

REASONING = ["Let", " me", " think", " about", " robots", "."]
CONTENT = ["Once", " upon", " a", " time", ",", " a", " robot", " named", " Ada", " wrote", " code", "."]
GENERATED = len(REASONING) + 2 + len(CONTENT)  # <think> reasoning </think> content
PROMPT = FakeEngine.PROMPT_TOKENS
REQ: dict[str, Any] = {
    "model": "m1",
    "messages": [{"role": "user", "content": "Tell me a story."}],
    "temperature": 0,
    "stream": True,
    "stream_options": {"include_usage": True},
}
FIRST_CONTENT = 1 + len(REASONING)  # the event index of the first content delta (0: role)


def engines(field: str = "reasoning_content", as_reasoning: bool = False) -> tuple[FakeEngine, FakeEngine]:
    def one(served: str) -> FakeEngine:
        return FakeEngine(
            served,
            tokens=list(CONTENT),
            reasoning=list(REASONING),
            reasoning_field=field,
            continuation_as_reasoning=as_reasoning,
        )

    return one("m1-spec"), one("m1-base")


@dataclass
class Received:
    reasoning: str = ""
    content: str = ""
    roles: int = 0
    finishes: list[str] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)
    usage: Any = None
    chunks: int = 0


async def read(
    stream: openai.AsyncStream[Any], on_chunk: Callable[[Received], Any] | None = None
) -> Received:
    got = Received()
    async for chunk in stream:
        got.ids.add(chunk.id)
        got.usage = chunk.usage or got.usage
        for c in chunk.choices:
            d = c.delta
            got.roles += d.role is not None
            got.reasoning += getattr(d, "reasoning_content", None) or getattr(d, "reasoning", None) or ""
            got.content += d.content or ""
            if c.finish_reason:
                got.finishes.append(c.finish_reason)
        got.chunks += 1
        if on_chunk is not None:
            await on_chunk(got)
    return got


@asynccontextmanager
async def gateway(spec: FakeEngine, base: FakeEngine, **over: Any) -> AsyncIterator[tuple[Harness, Any]]:
    async with harness(spec=spec, base=base, **over) as h:
        client = await asyncio.to_thread(
            openai.AsyncOpenAI, base_url=h.openai_base, api_key="unused", max_retries=0
        )
        try:
            yield h, client
        finally:
            await client.close()


async def drain(h: Harness, engine: str = "spec0") -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(h.url("/admin/drain"), json={"engine": engine, "draining": True, "move": True}) as r,
    ):
        assert r.status == 200
        out: dict[str, Any] = await r.json()
        return out


async def moved_at(
    spec: FakeEngine, base: FakeEngine, pause_at: int, *, hold: bool = True, **extra: Any
) -> tuple[Received, dict[str, Any], Harness]:
    """Stream the request; when the spec engine has sent event ``pause_at`` (and the client
    has it), drain spec0 with ``move``, then let spec send one event more and (``hold``)
    hold: the relay reads that event and moves before spec says anything else."""
    spec.gate, spec.pause_at = asyncio.Event(), pause_at
    spec.hold_after = pause_at + 1 if hold else None
    reply: dict[str, Any] = {}
    async with gateway(spec, base) as (h, client):
        stream = await client.chat.completions.create(**{**REQ, **extra})

        async def on_chunk(got: Received) -> None:
            if got.chunks == pause_at + 1 and not reply:  # the client has event pause_at
                await asyncio.wait_for(spec.paused.wait(), 10)
                reply.update(await drain(h))
                assert spec.gate is not None
                spec.gate.set()

        got = await read(stream, on_chunk)
        spec.hold.set()
        return got, reply, h


def unmoved(got: Received) -> None:
    assert got.reasoning == "".join(REASONING) and got.content == "".join(CONTENT)
    assert got.roles == 1 and got.finishes == ["stop"] and len(got.ids) == 1
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (PROMPT, GENERATED)
    assert got.usage.total_tokens == PROMPT + GENERATED


@pytest.mark.parametrize("field_name", ["reasoning_content", "reasoning"])
@pytest.mark.parametrize("as_reasoning", [False, True], ids=["parser-sees-prompt", "parser-sees-output"])
async def test_a_reasoning_answer_moved_in_its_content_keeps_every_token(
    field_name: str, as_reasoning: bool
) -> None:
    """Moved after 3 content chunks: the sibling continues from prompt + think block +
    content so far (Qwen3's form, in the final assistant message), is asked only for the
    tokens left of ``max_tokens`` (reasoning counted), and the client gets the unmoved
    answer and usage, even from a sibling whose parser labels the rest as reasoning."""
    spec, base = engines(field_name, as_reasoning)
    got, reply, _ = await moved_at(spec, base, FIRST_CONTENT + 2, max_tokens=200)
    assert reply["moving"] == 1 and reply["moving_later"] == 0
    unmoved(got)
    asked = [r.body for r in base.requests if r.path == "/v1/chat/completions"]
    assert len(asked) == 1 and spec.aborted.is_set()
    (cont,) = asked
    sent_content = "".join(CONTENT[:4])  # 3 chunks, then the one the relay read before moving
    assert cont["messages"][-1] == {
        "role": "assistant",
        "content": "<think>\n" + "".join(REASONING) + "\n</think>\n\n" + sent_content,
    }
    assert cont["continue_final_message"] is True and cont["add_generation_prompt"] is False
    assert cont["max_tokens"] == 200 - (len(REASONING) + 2 + 4)


async def test_an_unmoved_reasoning_answer_is_the_reference() -> None:
    spec, base = engines()
    async with gateway(spec, base) as (_, client):
        unmoved(await read(await client.chat.completions.create(**REQ)))


async def test_a_move_asked_while_thinking_waits_for_the_content() -> None:
    """Mid-reasoning the continuation cannot be written as a chat message (Qwen3's template
    renders a final assistant message after an ended think block): the drain reply says so
    (``moving_later``), and the stream moves at its first content."""
    spec, base = engines()
    spec.gate, spec.pause_at, spec.hold_after = asyncio.Event(), 2, FIRST_CONTENT
    reply: dict[str, Any] = {}
    async with gateway(spec, base) as (h, client):

        async def on_chunk(got: Received) -> None:
            if got.chunks == 3 and not reply:
                await asyncio.wait_for(spec.paused.wait(), 10)
                reply.update(await drain(h))
                assert spec.gate is not None
                spec.gate.set()

        got = await read(await client.chat.completions.create(**REQ), on_chunk)
        spec.hold.set()
    assert reply["moving"] == 0 and reply["moving_later"] == 1
    unmoved(got)
    (cont,) = [r.body for r in base.requests if r.path == "/v1/chat/completions"]
    assert cont["messages"][-1]["content"].endswith("</think>\n\n" + CONTENT[0])


async def test_a_finished_answer_is_not_moved() -> None:
    """The last content chunk (with its finish_reason) sent, ``[DONE]`` not yet: nothing is
    left to continue, the drain moves nothing and the client sees one finish."""
    spec, base = engines()
    last = len(REASONING) + len(CONTENT)
    spec.gate, spec.pause_at = asyncio.Event(), last
    reply: dict[str, Any] = {}
    async with gateway(spec, base) as (h, client):

        async def on_chunk(got: Received) -> None:
            if got.finishes and not reply:
                await asyncio.wait_for(spec.paused.wait(), 10)
                reply.update(await drain(h))
                assert spec.gate is not None
                spec.gate.set()

        got = await read(await client.chat.completions.create(**REQ), on_chunk)
        assert len(h.app[STATE].moves["m1"]) == 0
    assert reply["moving"] == 0 and reply["moving_later"] == 0
    unmoved(got)
    assert not base.requests and not spec.aborted.is_set()


@pytest.mark.parametrize(
    "pinned",
    [{"frequency_penalty": 0.5}, {"presence_penalty": -0.2}, {"extra_body": {"repetition_penalty": 1.1}}],
    ids=["frequency", "presence", "repetition"],
)
async def test_a_penalised_request_is_not_moved(pinned: dict[str, Any]) -> None:
    spec, base = engines()
    got, reply, _ = await moved_at(spec, base, FIRST_CONTENT + 2, hold=False, **pinned)
    assert reply["moving"] == 0 and reply["moving_later"] == 0
    unmoved(got)
    assert not base.requests


@dataclass
class Recording(FixedPolicy):
    outcomes: list[Outcome] = field(default_factory=list)
    seen: asyncio.Event = field(default_factory=asyncio.Event)

    def observe(self, outcome: Outcome, now: float) -> None:
        self.outcomes.append(outcome)
        self.seen.set()


class Spy:
    """Telemetry hooks that record the order of the token events."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.reasoning: int | None = None

    def start_request(self, *a: Any, **kw: Any) -> Spy:
        return self

    def access_log_entry(self, result: str) -> None: ...
    def decided(self, *a: Any) -> None: ...
    def upstream_started(self, *a: Any) -> dict[str, str]:
        return {}

    def upstream_first_byte(self, engine: str) -> None: ...
    def upstream_failed(self, *a: Any) -> None: ...
    def stream_moved(self, *a: Any) -> None: ...
    def first_token(self) -> None:
        self.events.append("first_token")

    def first_content(self) -> None:
        self.events.append("first_content")

    def reasoning_tokens(self, tokens: int) -> None:
        self.reasoning = tokens

    def finished(self, status: int, **kw: Any) -> None:
        self.events.append("finished")


async def test_ttft_is_the_first_token_of_any_kind_and_content_is_timed_apart() -> None:
    """The engine holds after its first reasoning delta: by then the gateway has recorded
    the first token (TTFT) but no content; the learning's TPOT runs from the first token."""
    spec, base = engines()
    spy, policy = Spy(), Recording(Route.SPEC)
    spec.gate, spec.pause_at = asyncio.Event(), 1
    at_pause: list[str] = []
    async with (
        harness(spec=spec, base=base, telemetry=spy, policies={"m1": policy}) as h,
        aiohttp.ClientSession() as s,
        s.post(h.url("/v1/chat/completions"), json=REQ) as r,
    ):
        first = await r.content.readuntil(b"\n\n")  # the role chunk
        first += await r.content.readuntil(b"\n\n")  # the first reasoning delta
        assert b'"reasoning_content":"Let"' in first
        at_pause.extend(spy.events)
        assert spec.gate is not None
        spec.gate.set()
        await r.read()
        await asyncio.wait_for(policy.seen.wait(), 10)
    assert at_pause == ["first_token"]
    assert spy.events == ["first_token", "first_content", "finished"]
    assert spy.reasoning == round(GENERATED * len("".join(REASONING)) / len("".join(REASONING + CONTENT)))
    (o,) = policy.outcomes
    assert o.completion_tokens == GENERATED and o.ttft_s is not None and o.tpot_s is not None


async def test_a_tool_call_only_answer_records_its_timings() -> None:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        ev = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m1-spec"}
        ev["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
        return b"data: " + json.dumps(ev).encode() + b"\n\n"

    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}
    raw = [
        chunk({"role": "assistant", "content": ""}),
        chunk({"tool_calls": [call]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"x": 1}'}}]}, "tool_calls"),
        b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m1-spec","choices":[],'
        b'"usage":{"prompt_tokens":7,"completion_tokens":9,"total_tokens":16}}\n\n',
        b"data: [DONE]\n\n",
    ]
    spec = FakeEngine("m1-spec", raw_stream=raw)
    spy, policy = Spy(), Recording(Route.SPEC)
    async with (
        harness(spec=spec, telemetry=spy, policies={"m1": policy}) as h,
        aiohttp.ClientSession() as s,
        s.post(h.url("/v1/chat/completions"), json=REQ) as r,
    ):
        assert b'"tool_calls"' in await r.read()
        await asyncio.wait_for(policy.seen.wait(), 10)
    assert spy.events == ["first_token", "first_content", "finished"]
    (o,) = policy.outcomes
    assert o.completion_tokens == 9 and o.ttft_s is not None and o.tpot_s is not None
