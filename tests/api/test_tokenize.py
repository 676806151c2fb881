"""vLLM's ``POST /tokenize`` and ``POST /detokenize`` through the gateway: passed to a
healthy engine of the model under its served name, bodies validated, keys and models
checked, every failure an OpenAI-shaped error."""

from __future__ import annotations

from typing import Any

import aiohttp

from gateway.api.state import STATE
from tests.proxy.harness import harness

KEY = "client-key-tok1"


async def _post(url: str, body: Any, key: str | None = None) -> tuple[int, dict[str, Any], dict[str, str]]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with aiohttp.ClientSession() as s, s.post(url, json=body, headers=headers) as r:
        return r.status, await r.json(), {k.lower(): v for k, v in r.headers.items()}


def _openai_error(out: dict[str, Any]) -> dict[str, Any]:
    assert set(out) == {"error"} and set(out["error"]) == {"message", "type", "param", "code"}
    return out["error"]


async def test_tokenize_and_detokenize_reach_an_engine_of_the_model() -> None:
    async with harness() as h:
        status, out, headers = await _post(h.url("/tokenize"), {"model": "m1", "prompt": "a b c"})
        assert status == 200 and out["count"] == 3 and out["tokens"] == [0, 1, 2]
        assert headers["x-specgate-engine"] in ("spec0", "base0") and "x-request-id" in headers
        msgs = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True}
        status, out, _ = await _post(h.url("/tokenize"), msgs)
        assert status == 200 and out["count"] == 1
        status, out, _ = await _post(h.url("/detokenize"), {"model": "m1", "tokens": [4, 2]})
        assert (status, out) == (200, {"prompt": "w4 w2"})
    seen = h.spec.requests + h.base.requests
    assert [r.path for r in seen] == ["/tokenize", "/tokenize", "/detokenize"]
    assert {r.body["model"] for r in seen} <= {"m1-spec", "m1-base"}


async def test_invalid_bodies_are_400_before_any_engine() -> None:
    async with harness() as h:
        for path, body, param in (
            ("/tokenize", {"model": "m1"}, "prompt"),
            ("/tokenize", {"model": "m1", "prompt": "a", "messages": [{"role": "user"}]}, "prompt"),
            ("/tokenize", {"model": "m1", "prompt": 5}, "prompt"),
            ("/tokenize", {"model": "m1", "messages": []}, "messages"),
            ("/tokenize", {"model": "m1", "prompt": "a", "add_special_tokens": "yes"}, "add_special_tokens"),
            ("/detokenize", {"model": "m1", "tokens": ["a"]}, "tokens"),
            ("/detokenize", {"model": "m1", "tokens": [True]}, "tokens"),
            ("/detokenize", {"model": "m1"}, "tokens"),
            ("/detokenize", {"tokens": [1]}, "model"),
        ):
            status, out, _ = await _post(h.url(path), body)
            assert status == 400, (path, body)
            assert _openai_error(out)["param"] == param
        status, out, _ = await _post(h.url("/tokenize"), [1, 2])
        assert status == 400 and _openai_error(out)["code"] == "invalid_json"
    assert h.spec.requests == [] and h.base.requests == []


async def test_unknown_model_keys_and_no_engine_are_openai_errors() -> None:
    async with harness(server={"api_keys": [KEY]}) as h:
        status, out, _ = await _post(h.url("/tokenize"), {"model": "m1", "prompt": "a"})
        assert status == 401 and _openai_error(out)["code"] == "invalid_api_key"
        status, out, _ = await _post(h.url("/tokenize"), {"model": "nope", "prompt": "a"}, KEY)
        assert status == 404 and _openai_error(out)["code"] == "model_not_found"
        for rt in h.app[STATE].models["m1"].engines.values():
            rt.draining = True
        status, out, headers = await _post(h.url("/detokenize"), {"model": "m1", "tokens": [1]}, KEY)
        assert status == 503 and _openai_error(out)["code"] == "no_engine_available"
        assert headers["retry-after"] == "1"
    assert h.spec.requests == [] and h.base.requests == []


async def test_an_engine_error_comes_back_in_the_gateways_shape() -> None:
    async with harness() as h:
        h.spec.status = h.base.status = 400
        status, out, _ = await _post(h.url("/tokenize"), {"model": "m1", "prompt": "a"})
        assert status == 400
        err = _openai_error(out)
        assert err["message"] == "engine says no" and err["type"] == "invalid_request_error"


async def test_an_unreachable_engine_is_a_502() -> None:
    async with harness(base_url="http://127.0.0.1:9", spec_url="http://127.0.0.1:9") as h:
        status, out, _ = await _post(h.url("/tokenize"), {"model": "m1", "prompt": "a"})
        assert status == 502 and _openai_error(out)["code"] == "upstream_error"
