"""A model served by a plain engine alone (a pair without ``spec``): every request goes to
it, whatever the policy or the client asks, and the advisor says what speculation would
buy (OpenAI SDK → gateway → one emulated plain engine, real sockets)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer
from pydantic import ValidationError

from gateway.api.app import build_app
from gateway.api.state import STATE
from gateway.config import GatewayConfig, load_config
from gateway.routing.config import RoutingConfig
from gateway.routing.factory import build_policy
from gateway.routing.rules import NoEngineAvailable
from gateway.routing.types import EngineView, ModelView, PairView, RequestFeatures, Route
from gateway.telemetry import build_telemetry
from specgate_lab.emulator.launch import pair_launches, start_group

pytestmark = pytest.mark.timeout(90)

EDIT = (
    "Add type hints, return the full file unchanged otherwise:\n```python\n"
    + "".join(f"def f{i}(a, b):\n    return a * {i} + b\n\n" for i in range(30))
    + "```"
)


def _engine(name: str, url: str, served: str = "qwen3-8b", **extra: Any) -> dict[str, Any]:
    return {"name": name, "url": url, "served_model_name": served, **extra}


def plain_config(url: str, served: str = "qwen3-8b", **model: Any) -> GatewayConfig:
    return GatewayConfig.model_validate(
        {
            "server": {"port": 0},
            "scrape": {"interval_s": 0.1, "timeout_s": 1.0},
            "models": [{"name": "qwen3-8b", "pairs": [{"base": _engine("plain", url, served)}], **model}],
        }
    )


def test_a_pair_without_spec_is_the_plain_engine_alone_and_cannot_be_mixed() -> None:
    example = load_config(Path(__file__).parents[2] / "deploy" / "examples" / "plain-engine.yaml", env={})
    assert [(p.spec, p.base.name) for p in example.models[0].pairs] == [(None, "plain0")]
    cfg = plain_config("http://127.0.0.1:9")
    assert cfg.models[0].pairs[0].spec is None and [e.name for e in cfg.models[0].pairs[0].engines] == [
        "plain"
    ]
    assert cfg.models[0].advice.k == 5 and cfg.models[0].advice.prompt_lookup_min == 2
    assert cfg.models[0].advice.suffix_cached_answers == 0  # the suffix replay is opt-in live
    mixed = {
        "models": [
            {
                "name": "m",
                "pairs": [
                    {"base": _engine("b0", "http://h:1")},
                    {
                        "spec": _engine("s1", "http://h:2", method="ngram", k=5),
                        "base": _engine("b1", "http://h:3"),
                    },
                ],
            }
        ]
    }
    with pytest.raises(ValidationError, match="mixes pairs with and without a spec engine"):
        GatewayConfig.model_validate(mixed)
    with pytest.raises(ValidationError, match="prompt_lookup_min must be"):
        plain_config("http://h:1", advice={"prompt_lookup_min": 4, "prompt_lookup_max": 3})


@pytest.mark.parametrize("policy", ["adaptive", "always-spec", "temperature"])
def test_every_policy_sends_everything_to_the_plain_engine_alone(policy: str) -> None:
    p = build_policy(RoutingConfig(policy=policy))
    up = ModelView("m", (PairView(spec=None, base=EngineView(name="b", route=Route.BASE)),))
    for f in (
        RequestFeatures(model="m", temperature=0.0),
        RequestFeatures(model="m", temperature=0.0, forced=Route.SPEC),
        RequestFeatures(model="m", temperature=0.0, refused_params=("min_p",)),
    ):
        d = p.decide(f, up, 1.0)
        assert (d.route, d.engine, d.reason, d.fallback) == (Route.BASE, "b", "no_spec", None)
    down = ModelView("m", (PairView(spec=None, base=EngineView(name="b", route=Route.BASE, healthy=False)),))
    with pytest.raises(NoEngineAvailable):
        p.decide(RequestFeatures(model="m", temperature=0.0), down, 2.0)


async def test_the_gateway_in_front_of_a_plain_engine_alone_routes_to_it_and_advises() -> None:
    group = await start_group(pair_launches(port_spec=0, port_base=0)[1:], time_scale=0.05)
    [plain] = group.engines
    tel = build_telemetry({"tracing": "off", "process_metrics": False}, known_models=["qwen3-8b"])
    gw = TestServer(
        build_app(
            plain_config(
                plain.url,
                plain.launch.config.served_model_name,
                advice={"k": 4, "suffix_cached_answers": 128},
            ),
            telemetry=tel,
        )
    )
    await gw.start_server()
    client = await asyncio.to_thread(
        openai.AsyncOpenAI, base_url=str(gw.make_url("/v1")), api_key="unused", max_retries=0, timeout=30
    )
    try:
        for t in (0.0, 0.0, 1.0):
            raw = await client.chat.completions.with_raw_response.create(
                model="qwen3-8b",
                messages=[{"role": "user", "content": EDIT}],
                temperature=t,
                max_tokens=120,
                extra_headers={"x-specgate-route": "spec"},  # nothing to force it onto
            )
            assert raw.headers["x-specgate-route"] == "base" and raw.headers["x-specgate-reason"] == "no_spec"
            assert raw.parse().choices[0].message.content
        stream = await client.chat.completions.create(
            model="qwen3-8b", messages=[{"role": "user", "content": EDIT}], max_tokens=40, stream=True
        )
        assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        st = gw.app[STATE]
        async with asyncio.timeout(30):
            await asyncio.gather(*list(st.background))  # the learning replays
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as s:
            async with s.get(str(gw.make_url("/admin/advice")), params={"loads": "1,64"}) as r:
                assert r.status == 200
                advice = (await r.json())["qwen3-8b"]
            async with s.get(str(gw.make_url("/admin/state"))) as r:
                state = await r.json()
            async with s.get(str(gw.make_url("/metrics"))) as r:
                exposition = await r.text()
    finally:
        await client.close()
        await gw.close()
        await group.stop()
    assert advice["all"]["requests"] == 4
    assert advice["settings"] == {
        "k": 4,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 5,
        "profile": "h200-qwen3-8b",
    }
    [greedy] = [c for c in advice["classes"] if c["temperature"] == "T ≤ 0.05"]
    assert greedy["kind"] == "edit" and greedy["acceptance_rate"] > 0.3  # the answers copy the file
    assert advice["predictions"][0]["speedup"] > 1.0
    # the plain engine as measured: its streamed answers' time per token (a whole answer
    # shows none), and each proposer's predicted time per token scaled from the profile to it
    measured = advice["measured"]
    assert measured["answers"] == 1 and measured["plain_ms"] > 0 and measured["in_flight"] >= 1
    for proposer in ("ngram", "suffix"):
        m = measured[proposer]
        scale = measured["plain_ms"] / m["profile_plain_ms"]
        assert m["spec_ms"] == pytest.approx(m["profile_spec_ms"] * scale)
    assert advice["suffix"]["all"]["requests"] == 4
    model = state["models"]["qwen3-8b"]
    assert model["pairs"][0]["spec"] is None and model["pairs"][0]["base"]["name"] == "plain"
    assert 'specgate_advice_answers_total{model="qwen3-8b"} 4.0' in exposition
    assert 'engine="plain"' in exposition and 'engine="spec0"' not in exposition
