"""The OpenAI SDK's Responses API through the gateway onto an emulated pair that reasons
(``--reasoning-parser qwen3``): ``responses.create`` and ``responses.stream`` are routed
as chat is, and come back with their reasoning and message items, the client's model
name and the engine's usage."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestServer

from gateway.api.app import build_app
from specgate_lab.emulator.launch import EmulatorGroup
from tests.conftest import gateway_config_for
from tests.emulator.prompts import EDITS
from tests.emulator.sdk import sdk_client
from tests.emulator.thinking import generated_tokens

pytestmark = pytest.mark.timeout(90)


async def test_sdk_responses_through_the_gateway_onto_the_emulator(thinking: EmulatorGroup) -> None:
    cfg = gateway_config_for(thinking, **{"models.0.routing.policy": "temperature"})
    gw = TestServer(build_app(cfg))
    await gw.start_server()
    try:
        async with sdk_client(str(gw.make_url(""))) as client:
            raw = await client.responses.with_raw_response.create(
                model="qwen3-8b",
                input=EDITS[0],
                instructions="Be exact.",
                temperature=0,
                max_output_tokens=400,
            )
            assert raw.headers["x-specgate-route"] == "spec"
            r = raw.parse()
            assert r.model == "qwen3-8b" and r.status in ("completed", "incomplete")
            assert r.output[0].type == "reasoning"
            assert r.usage is not None and 0 < r.usage.output_tokens <= 400
            assert r.usage.output_tokens_details.reasoning_tokens > 0

            ask = {"model": "qwen3-8b", "input": EDITS[1], "temperature": 0.9, "max_output_tokens": 600}
            async with client.responses.stream(**ask) as stream:  # type: ignore[arg-type]
                events = [e async for e in stream]
                final = await stream.get_final_response()
            types = [e.type for e in events]
            assert types[0] == "response.created"
            assert types[-1] in ("response.completed", "response.incomplete")
            assert final.model == "qwen3-8b"
            text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            assert text == final.output_text
            assert final.usage is not None and final.usage.output_tokens > 0
    finally:
        await gw.close()
    # temperature 0.9 went to the plain engine, which generated the streamed answer
    assert await generated_tokens(thinking.urls[1]) == final.usage.output_tokens
