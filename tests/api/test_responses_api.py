"""``POST /v1/responses`` (the OpenAI Responses API, as vLLM serves it) through the gateway
with the real OpenAI SDK: ``responses.create`` and ``responses.stream``, routed with the
same decision as chat, the model renamed, usage counted, streams never moved."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import aiohttp
import openai
import pytest
from openai import NOT_GIVEN
from openai._models import construct_type
from openai.lib.streaming.responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent

from gateway.pipeline.request import RESPONSES, BadRequest, parse_request
from tests.proxy.fake_engine import FakeEngine
from tests.proxy.fake_responses import response_events
from tests.proxy.harness import harness

TEXT = "Hello, world!"


def _client() -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="unused", max_retries=0)


def _warm_sdk() -> None:
    """The SDK imports its resources and builds its event models lazily: done here, off the
    event loop, by reading one fake stream the way ``responses.stream`` does."""
    _ = _client().responses
    state = ResponseStreamState(input_tools=NOT_GIVEN, text_format=NOT_GIVEN)
    for ev in response_events({}, ["a"], "m"):
        data = json.loads(ev.split(b"data: ", 1)[1])
        state.handle_event(construct_type(type_=ResponseStreamEvent, value=data))  # type: ignore[arg-type]


@pytest.fixture
def make_client() -> Callable[[], openai.AsyncOpenAI]:
    _warm_sdk()
    return _client


async def test_create_is_routed_as_chat_and_renamed(make_client: Callable[[], openai.AsyncOpenAI]) -> None:
    client = make_client()
    async with harness() as h:
        client.base_url = h.openai_base  # type: ignore[assignment]
        try:
            raw = await client.responses.with_raw_response.create(
                model="m1", input="say hello", instructions="be brief", temperature=0
            )
            resp = raw.parse()
            assert raw.headers["x-specgate-route"] == "spec"  # temperature 0: as chat would go
            assert resp.model == "m1" and resp.output_text == TEXT
            assert resp.usage is not None and resp.usage.output_tokens == 2
            hot = await client.responses.with_raw_response.create(
                model="m1", input="tell a story", temperature=0.9
            )
            assert hot.headers["x-specgate-route"] == "base"
        finally:
            await client.close()
    sent = h.spec.requests[0]
    assert sent.path == "/v1/responses" and sent.body["model"] == "m1-spec"
    assert "store" not in sent.body and "stream_options" not in sent.body  # passed as sent
    assert h.base.requests[0].body["model"] == "m1-base"


async def test_stream_helper_and_raw_stream(make_client: Callable[[], openai.AsyncOpenAI]) -> None:
    client = make_client()
    async with harness() as h:
        client.base_url = h.openai_base  # type: ignore[assignment]
        try:
            ask = {"model": "m1", "input": "say hello", "temperature": 0, "store": False}
            async with client.responses.stream(**ask) as s:  # type: ignore[arg-type]
                deltas = [ev.delta async for ev in s if ev.type == "response.output_text.delta"]
                final = await s.get_final_response()
            assert "".join(deltas) == TEXT and final.output_text == TEXT
            assert final.model == "m1" and final.usage is not None and final.usage.total_tokens == 9

            items = [{"role": "user", "content": "hi"}]
            stream = await client.responses.create(model="m1", input=items, stream=True)  # type: ignore[arg-type]
            kinds, models = [], []
            async for ev in stream:
                kinds.append(ev.type)
                if ev.type in ("response.created", "response.completed"):
                    models.append(ev.response.model)
            assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
            assert models == ["m1", "m1"]
        finally:
            await client.close()
    assert h.spec.requests[0].body["store"] is False  # the client's store passes through


async def test_bad_input_is_an_openai_400_before_any_engine(
    make_client: Callable[[], openai.AsyncOpenAI],
) -> None:
    client = make_client()
    async with harness() as h:
        client.base_url = h.openai_base  # type: ignore[assignment]
        try:
            bad_bodies = (
                {"input": []},
                {"input": "x", "previous_response_id": "resp_1"},
                {"input": [{"content": 3}]},
            )
            for bad in bad_bodies:
                with pytest.raises(openai.BadRequestError) as exc:
                    await client.responses.create(model="m1", **bad)  # type: ignore[call-overload]
                assert exc.value.status_code == 400
        finally:
            await client.close()
    assert h.spec.requests == [] and h.base.requests == []


def test_features_come_from_instructions_and_input() -> None:
    body = {
        "model": "m1",
        "instructions": "You rewrite code.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "def f(): pass"}]},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
            {"role": "user", "content": "Rewrite it, unchanged otherwise."},
        ],
        "max_output_tokens": 64,
        "temperature": 0.2,
    }
    parsed = parse_request(body, RESPONSES, None, allow_override=False)
    assert parsed.prompt_text == "You rewrite code.\ndef f(): pass\n42\nRewrite it, unchanged otherwise."
    f = parsed.features
    assert (f.max_tokens, f.temperature, f.stream, f.kind) == (64, 0.2, False, "edit")
    assert parsed.include_usage  # a Responses stream ends with its usage: nothing to add
    with pytest.raises(BadRequest):
        parse_request({**body, "max_output_tokens": 0}, RESPONSES, None, allow_override=False)


async def test_a_responses_stream_is_never_moved() -> None:
    gate = asyncio.Event()
    async with harness(spec=FakeEngine("m1-spec", gate=gate)) as h, aiohttp.ClientSession() as s:
        body = {"model": "m1", "input": "say hello", "temperature": 0, "stream": True}
        async with s.post(h.url("/v1/responses"), json=body) as r:
            assert r.status == 200 and r.headers["x-specgate-route"] == "spec"
            await h.spec.first_sent.wait()
            drain = {"engine": "spec0", "draining": True, "move": True}
            async with s.post(h.url("/admin/drain"), json=drain) as d:
                assert (await d.json())["moving"] == 0
            gate.set()
            events = (await r.read()).decode()
    assert events.count("response.output_text.delta") == 2 * 4  # event line + type field
    assert '"type":"response.completed"' in events.replace(" ", "") and "[DONE]" not in events
    assert h.base.requests == []


async def test_a_broken_stream_raises_in_the_sdk(make_client: Callable[[], openai.AsyncOpenAI]) -> None:
    client = make_client()
    async with harness(spec=FakeEngine("m1-spec", die_after_first=True)) as h:
        client.base_url = h.openai_base  # type: ignore[assignment]
        try:
            stream = await client.responses.create(model="m1", input="say hello", temperature=0, stream=True)
            kinds = []
            with pytest.raises(openai.APIError, match="broke off the stream"):
                async for ev in stream:
                    kinds.append(ev.type)
            assert kinds == ["response.created"]
        finally:
            await client.close()
