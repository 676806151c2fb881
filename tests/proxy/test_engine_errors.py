"""Engine errors reach the client in the gateway's one shape: OpenAI's vocabulary
(``{"error": {"message", "type", "param", "code"}}``, ``invalid_request_error``...), the
engine's message and the HTTP status kept, in a body and inside a stream alike."""

from __future__ import annotations

import json
from collections.abc import Callable

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from gateway.api.app import build_app
from gateway.config import GatewayConfig
from tests.proxy.fake_engine import FakeEngine
from tests.proxy.harness import harness

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.9}
KEYS = {"message", "type", "param", "code"}


async def _post(url: str, body: dict[str, object]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        return r.status, await r.read()


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (400, None, ("engine says no", "invalid_request_error", None, "engine_error")),
        (  # vLLM before 0.6: the fields at the top level
            400,
            {"object": "error", "message": "too long", "type": "BadRequestError", "param": "max_tokens"},
            ("too long", "invalid_request_error", "max_tokens", "engine_error"),
        ),
        (  # an engine that speaks OpenAI's codes keeps its code
            404,
            {"error": {"message": "no such lora", "type": "NotFoundError", "code": "model_not_found"}},
            ("no such lora", "not_found_error", None, "model_not_found"),
        ),
        (503, None, ("engine says no", "service_unavailable", None, "engine_error")),  # after the retry
    ],
)
async def test_an_engine_error_body_speaks_the_gateways_vocabulary(
    status: int, body: dict[str, object] | None, expected: tuple[object, ...]
) -> None:
    raw = json.dumps(body).encode() if body is not None else None
    spec = FakeEngine("m1-spec", status=status, error_body=raw)
    base = FakeEngine("m1-base", status=status, error_body=raw)
    async with harness(spec=spec, base=base) as h:
        got, out = await _post(h.url("/v1/chat/completions"), CHAT)
    assert got == status
    err = json.loads(out)["error"]
    assert set(err) == KEYS
    assert (err["message"], err["type"], err["param"], err["code"]) == expected


async def test_an_engine_error_event_in_a_stream_speaks_the_gateways_vocabulary() -> None:
    base = FakeEngine("m1-base", send_error_event=True)
    async with harness(base=base) as h:
        got, out = await _post(h.url("/v1/chat/completions"), {**CHAT, "stream": True})
    assert got == 200
    events = [e for e in out.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]" and len(events) == 2
    err = json.loads(events[0][6:])["error"]
    # Inside a stream the code is the status number, as in the gateway's own error events.
    assert err == {
        "message": "min_p is not supported",
        "type": "invalid_request_error",
        "param": None,
        "code": 400,
    }


async def test_the_emulators_refusal_reaches_the_client_in_the_gateways_shape(
    pair_config: Callable[..., GatewayConfig],
) -> None:
    gw = TestServer(build_app(pair_config()))
    await gw.start_server()
    try:
        body = {"model": "qwen3-8b", "messages": CHAT["messages"], "max_tokens": 10**7}
        for stream in (False, True):
            got, out = await _post(str(gw.make_url("/v1/chat/completions")), {**body, "stream": stream})
            assert got == 400, out
            err = json.loads(out)["error"]
            assert set(err) == KEYS and err["type"] == "invalid_request_error"
            assert err["code"] == "engine_error" and "maximum context length" in err["message"]
    finally:
        await gw.close()
