"""``GET /admin/advice``: the gateway's sampled answers replayed with the model's n-gram
settings, served live (OpenAI SDK → gateway → emulated pair, real sockets)."""

from __future__ import annotations

import asyncio

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer

from gateway.api.app import build_app
from gateway.api.state import STATE
from gateway.telemetry import build_telemetry
from specgate_lab.emulator.launch import pair_launches, start_group
from tests.conftest import gateway_config_for

pytestmark = pytest.mark.timeout(90)

EDIT = (
    "Add type hints, return the full file unchanged otherwise:\n```python\n"
    + "".join(f"def f{i}(a, b):\n    return a * {i} + b\n\n" for i in range(30))
    + "```"
)


async def test_the_gateway_serves_advice_from_the_answers_it_relayed() -> None:
    group = await start_group(pair_launches(port_spec=0, port_base=0), time_scale=0.05)
    tel = build_telemetry({"tracing": "off", "process_metrics": False}, known_models=["qwen3-8b"])
    config = gateway_config_for(group, **{"models.0.advice.suffix_cached_answers": 128})
    gw = TestServer(build_app(config, telemetry=tel))
    await gw.start_server()
    client = await asyncio.to_thread(
        openai.AsyncOpenAI, base_url=str(gw.make_url("/v1")), api_key="unused", max_retries=0
    )
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(str(gw.make_url("/admin/advice"))) as r:
                assert r.status == 200 and await r.json() == {"qwen3-8b": {"requests": 0}}
            for t in (0.0, 0.0, 0.0, 1.0):
                got = await client.chat.completions.create(
                    model="qwen3-8b",
                    messages=[{"role": "user", "content": EDIT}],
                    temperature=t,
                    max_tokens=120,
                )
                assert got.choices[0].message.content
            st = gw.app[STATE]
            await asyncio.gather(*list(st.background))  # the learning replays
            async with s.get(str(gw.make_url("/admin/advice")), params={"loads": "1,64"}) as r:
                assert r.status == 200
                advice = (await r.json())["qwen3-8b"]
            async with s.get(str(gw.make_url("/admin/advice")), params={"loads": "0"}) as r:
                assert r.status == 400
                assert (await r.json())["error"]["param"] == "loads"
            async with s.get(str(gw.make_url("/metrics"))) as r:
                exposition = await r.text()
    finally:
        await client.close()
        await gw.close()
        await group.stop()
    assert advice["all"]["requests"] == 4
    assert advice["settings"]["k"] == 5 and advice["settings"]["prompt_lookup_min"] == 2
    [greedy] = [c for c in advice["classes"] if c["temperature"] == "T ≤ 0.05"]
    assert greedy["kind"] == "edit" and greedy["requests"] == 3
    assert greedy["acceptance_rate"] > 0.3  # the answer copies the file it edits
    loads = [p["load"] for p in advice["predictions"]]
    assert loads == [1.0, 64.0] and advice["in_flight_now"] == 1.0
    assert advice["predictions"][0]["speedup"] > 1.0
    # the same advice in /metrics, read at the scrape
    samples = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in exposition.splitlines()
        if line.startswith("specgate_advice_")
    }
    assert samples['specgate_advice_answers_total{model="qwen3-8b"}'] == 4.0
    key = (
        'specgate_advice_acceptance_rate{kind="edit",model="qwen3-8b",proposer="ngram",temperature="0-0.05"}'
    )
    assert samples[key] == pytest.approx(greedy["acceptance_rate"])
    one = 'specgate_advice_predicted_speedup{load="1",model="qwen3-8b",proposer="ngram"}'
    assert samples[one] == pytest.approx(advice["predictions"][0]["speedup"])
    tps = (
        'specgate_advice_tokens_per_step{kind="edit",model="qwen3-8b",proposer="suffix",temperature="0.75+"}'
    )
    [hot] = [c for c in advice["suffix"]["classes"] if c["temperature"] == "T > 0.75"]
    assert samples[tps] == pytest.approx(hot["tokens_per_step"])
    # the suffix replay: every answer, drafting from the earlier ones too
    assert (
        advice["suffix"]["all"]["requests"] == 4
        and advice["suffix"]["settings"]["max_cached_requests"] == 128
    )
    [sx] = [c for c in advice["suffix"]["classes"] if c["temperature"] == "T ≤ 0.05"]
    assert sx["acceptance_rate"] > 0.3
    suffix_one = 'specgate_advice_predicted_speedup{load="1",model="qwen3-8b",proposer="suffix"}'
    assert samples[suffix_one] == pytest.approx(advice["suffix"]["predictions"][0]["speedup"])
