"""``GET /v1/models`` keeps what the engines report: vLLM's ``max_model_len`` and ``root``."""

from __future__ import annotations

import socket
from collections.abc import Callable

import aiohttp
from aiohttp.test_utils import TestServer

from gateway.api.app import build_app
from gateway.config import GatewayConfig
from specgate_lab.emulator.launch import EmulatorGroup
from tests.proxy.harness import harness


async def _models(url: str) -> list[dict[str, object]]:
    async with aiohttp.ClientSession() as s, s.get(url + "/v1/models") as r:
        assert r.status == 200
        body = await r.json()
    assert body["object"] == "list"
    return body["data"]  # type: ignore[no-any-return]


async def _engine_card(url: str) -> dict[str, object]:
    (card,) = await _models(url)
    return card


async def test_the_engines_context_length_and_root_reach_the_client(
    pair: EmulatorGroup, pair_config: Callable[..., GatewayConfig]
) -> None:
    spec, base = [await _engine_card(e) for e in pair.urls]
    gw = TestServer(build_app(pair_config()))
    await gw.start_server()
    try:
        (card,) = await _models(str(gw.make_url("")).rstrip("/"))
    finally:
        await gw.close()
    assert isinstance(spec["max_model_len"], int) and isinstance(base["max_model_len"], int)
    assert card["id"] == "qwen3-8b" and card["owned_by"] == "specgate"  # the client-facing name
    assert card["max_model_len"] == min(spec["max_model_len"], base["max_model_len"])
    assert card["root"] == base["root"] and card["root"]  # the weights the engines serve
    assert "parent" in card


async def test_without_an_answering_engine_the_card_has_openais_fields_only() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    async with harness(spec_url=dead, base_url=dead) as h:
        (card,) = await _models(h.url("").rstrip("/"))
    assert set(card) == {"id", "object", "created", "owned_by"}
