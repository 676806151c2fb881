"""Shared pieces of the fleet tests: emulated pairs as config entries, a served gateway."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from gateway.api.app import build_app
from gateway.api.state import STATE, GatewayState
from gateway.config import GatewayConfig
from specgate_lab.emulator.launch import EmulatorGroup, pair_launches, start_group

MODEL = "qwen3-8b"


def pair_entry(group: EmulatorGroup, name: str, device: str) -> dict[str, Any]:
    """A config ``pairs`` entry for an emulated pair (engines ``<name>-spec`` / ``<name>-base``)."""
    spec, base = group.engines
    return {
        "name": name,
        "device": device,
        "spec": {
            "name": f"{name}-spec",
            "url": spec.url,
            "served_model_name": "qwen3-8b-spec",
            "method": "ngram",
            "k": 5,
        },
        "base": {"name": f"{name}-base", "url": base.url, "served_model_name": "qwen3-8b-base"},
    }


def config_data(pairs: list[dict[str, Any]], **model: Any) -> dict[str, Any]:
    return {
        "server": {"port": 0},
        "scrape": {"interval_s": 0.05, "timeout_s": 1.0},
        "fleet": {"drain_poll_s": 0.01},
        "models": [
            {
                "name": MODEL,
                "pairs": pairs,
                "routing": {"policy": "adaptive", "allow_client_override": True},
                **model,
            }
        ],
    }


async def emulated_pair(device: str, time_scale: float = 0.05) -> EmulatorGroup:
    return await start_group(
        pair_launches(port_spec=0, port_base=0, device=device, per_request_metrics=True),
        time_scale=time_scale,
    )


@asynccontextmanager
async def gateway(config: GatewayConfig, **kw: Any) -> AsyncIterator[tuple[TestServer, GatewayState]]:
    server = TestServer(build_app(config, **kw))
    await server.start_server()
    try:
        yield server, server.app[STATE]
    finally:
        await server.close()


def chat(max_tokens: int = 16, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me about the sea."}],
        "max_tokens": max_tokens,
        **extra,
    }


async def read_stream(resp: aiohttp.ClientResponse) -> tuple[int, bool, list[str]]:
    """(completion tokens from the usage, saw [DONE], error messages) of an SSE answer."""
    tokens, done, errors = 0, False, []
    async for raw in resp.content:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            continue
        event = json.loads(data)
        if "error" in event:
            errors.append(str(event["error"]))
        usage = event.get("usage")
        if usage:
            tokens = usage["completion_tokens"]
    return tokens, done, errors
