"""The emulator serves the Responses API as vLLM does: the OpenAI SDK's
``responses.create`` and ``responses.stream`` against an emulated engine, with and
without a reasoning parser."""

from __future__ import annotations

import aiohttp
import openai
import pytest

from specgate_lab.emulator.launch import EmulatorGroup
from tests.emulator.prompts import EDITS
from tests.emulator.sdk import sdk_client
from tests.emulator.thinking import generated_tokens

pytestmark = pytest.mark.timeout(90)

SPEC = "qwen3-8b-spec"


async def test_create_answers_with_reasoning_message_and_usage(thinking: EmulatorGroup) -> None:
    url = thinking.urls[0]
    async with sdk_client(url) as client:
        r = await client.responses.create(
            model=SPEC, input=EDITS[0], instructions="Be exact.", temperature=0, max_output_tokens=3000
        )
        chat = await client.chat.completions.create(
            model=SPEC,
            messages=[{"role": "system", "content": "Be exact."}, {"role": "user", "content": EDITS[0]}],
            temperature=0,
            max_tokens=3000,
        )
    assert r.status == "completed" and r.id.startswith("resp_") and r.object == "response"
    kinds = [item.type for item in r.output]
    assert kinds == ["reasoning", "message"]
    reasoning = r.output[0]
    assert reasoning.type == "reasoning" and reasoning.content
    assert reasoning.content[0].text == (chat.choices[0].message.model_extra or {})["reasoning"]
    assert r.output_text == chat.choices[0].message.content
    assert r.usage is not None and chat.usage is not None
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.usage.output_tokens == chat.usage.completion_tokens
    assert 0 < r.usage.output_tokens_details.reasoning_tokens < r.usage.output_tokens
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


async def test_stream_sends_typed_events_the_sdk_assembles(thinking: EmulatorGroup) -> None:
    url = thinking.urls[1]
    before = await generated_tokens(url)
    async with sdk_client(url) as client:
        whole = await client.responses.create(model="qwen3-8b-base", input=EDITS[1], temperature=0)
        async with client.responses.stream(model="qwen3-8b-base", input=EDITS[1], temperature=0) as stream:
            events = [e async for e in stream]
            final = await stream.get_final_response()
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert types.index("response.reasoning_text.delta") < types.index("response.output_text.delta")
    for t in ("response.output_item.added", "response.content_part.added", "response.output_item.done"):
        assert types.count(t) == 2  # the reasoning item and the message
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == final.output_text == whole.output_text
    assert final.usage is not None and whole.usage is not None
    assert final.usage.output_tokens == whole.usage.output_tokens
    # both answers' tokens counted on the engine's metrics, as a chat answer's are
    assert await generated_tokens(url) - before == 2 * whole.usage.output_tokens


async def test_a_plain_engine_answers_a_message_only_and_a_short_limit_is_incomplete(
    pair: EmulatorGroup,
) -> None:
    async with sdk_client(pair.urls[0]) as client:
        r = await client.responses.create(
            model=SPEC,
            input=[{"role": "user", "content": [{"type": "input_text", "text": EDITS[0]}]}],
            max_output_tokens=20,
        )
    assert [item.type for item in r.output] == ["message"]
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.usage is not None and r.usage.output_tokens == 20
    assert r.usage.output_tokens_details.reasoning_tokens == 0


async def test_nothing_is_stored_as_in_a_vllm_without_the_store(pair: EmulatorGroup) -> None:
    async with sdk_client(pair.urls[0]) as client:
        r = await client.responses.create(model=SPEC, input="hi", max_output_tokens=5, store=True)
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(r.id)
        with pytest.raises(openai.NotFoundError):
            await client.responses.create(model=SPEC, input="hi", previous_response_id=r.id)
        with pytest.raises(openai.BadRequestError, match="VLLM_ENABLE_RESPONSES_API_STORE"):
            await client.responses.create(model=SPEC, input="hi", background=True)
        with pytest.raises(openai.BadRequestError):
            await client.responses.create(model=SPEC, input=[{"type": "function_call_output"}])  # type: ignore[list-item]


async def test_a_crash_mid_stream_cuts_the_response_stream(pair: EmulatorGroup) -> None:
    url = pair.urls[0]
    async with aiohttp.ClientSession() as s:
        faults = {"crash_after_requests": 0, "crash_mid_stream": True, "mid_stream_chunks": 2}
        async with s.post(url + "/_emulator/faults", json=faults) as r:
            assert r.status == 200
        body = {"model": SPEC, "input": EDITS[0], "stream": True, "max_output_tokens": 200}
        got = b""
        with pytest.raises(aiohttp.ClientPayloadError):
            async with s.post(url + "/v1/responses", json=body) as r:
                async for piece in r.content.iter_any():
                    got += piece
    assert b"response.output_text.delta" in got and b"response.completed" not in got
