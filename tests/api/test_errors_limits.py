"""Every gateway error path: OpenAI error shape, status, message; limits and auth."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

from tests.proxy.fake_engine import FakeEngine
from tests.proxy.harness import harness

MSGS = [{"role": "user", "content": "hi"}]
KEY = "client-key-0001"


async def _post(url: str, data: Any = None, **kw: Any) -> tuple[int, CIMultiDict[str], dict[str, Any]]:
    async with aiohttp.ClientSession() as s, s.post(url, data=data, **kw) as r:
        return r.status, CIMultiDict(r.headers), await r.json(content_type=None)


def _assert_openai_error(body: dict[str, Any]) -> dict[str, Any]:
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert "Traceback" not in err["message"]
    return err  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"model": "m1", "messages": [], "temperature": NaN}', "NaN"),
        (
            b'{"model": "m1", "messages": [{"role": "user", "content": "x"}], "temperature": Infinity}',
            "Infinity",
        ),
        (b'{"model": "\xc3\x28"}', "UTF-8"),
        (b"[" * 100000 + b"]" * 100000, "objects/arrays"),  # counted on the bytes first
        (b'{"model": "m1", "x": ' + b"[" * 1000 + b"]" * 1000 + b"}", "nested"),
    ],
)
async def test_malformed_json_is_400(raw: bytes, needle: str) -> None:
    async with harness() as h:
        status, headers, body = await _post(h.url("/v1/chat/completions"), raw)
    assert status == 400
    err = _assert_openai_error(body)
    assert needle in err["message"]
    assert err["code"] == ("body_too_complex" if needle == "objects/arrays" else "invalid_json")
    assert headers["x-request-id"]
    assert h.spec.requests == [] and h.base.requests == []


@pytest.mark.parametrize(
    ("patch", "param"),
    [
        ({"model": 3}, "model"),
        ({"model": None}, "model"),
        ({"messages": None}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": ["hi"]}, "messages[0]"),
        ({"messages": [{"content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
            "messages[0].content[0].text",
        ),
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"n": 0}, "n"),
        ({"stream": "yes"}, "stream"),
        ({"stream_options": []}, "stream_options"),
        ({"logit_bias": [1]}, "logit_bias"),
        ({"min_p": 2}, "min_p"),
        ({"stop": [1]}, "stop"),
        ({"presence_penalty": 9}, "presence_penalty"),
        ({"seed": "x"}, "seed"),
    ],
)
async def test_bad_params_are_400_with_param(patch: dict[str, Any], param: str) -> None:
    body = {"model": "m1", "messages": MSGS, **patch}
    async with harness() as h:
        status, _, out = await _post(h.url("/v1/chat/completions"), json.dumps(body).encode())
    assert status == 400, out
    err = _assert_openai_error(out)
    assert err["param"] == param
    assert err["type"] == "invalid_request_error"


async def test_completions_need_a_prompt() -> None:
    async with harness() as h:
        status, _, out = await _post(h.url("/v1/completions"), json={"model": "m1"})
        assert status == 400 and _assert_openai_error(out)["param"] == "prompt"
        status, _, _ = await _post(h.url("/v1/completions"), json={"model": "m1", "prompt": [1, 2, 3]})
        assert status == 200


async def test_unknown_model_is_404_in_openai_shape() -> None:
    async with harness() as h:
        status, _, out = await _post(h.url("/v1/chat/completions"), json={"model": "gpt-9", "messages": MSGS})
    assert status == 404
    err = _assert_openai_error(out)
    assert err["code"] == "model_not_found" and "gpt-9" in err["message"] and "m1" in err["message"]


async def test_body_too_large_is_413() -> None:
    async with harness(server={"max_body_bytes": 4096}) as h:
        big = {"model": "m1", "messages": [{"role": "user", "content": "x" * 10000}]}
        status, _, out = await _post(h.url("/v1/chat/completions"), json=big)
        assert status == 413
        assert "4096" in _assert_openai_error(out)["message"]

        # same without a Content-Length (chunked upload)
        async def gen() -> Any:
            yield json.dumps(big).encode()

        status, _, out = await _post(h.url("/v1/chat/completions"), gen())
        assert status == 413
    assert h.base.requests == []


async def test_concurrency_limit_is_429_with_retry_after() -> None:
    gate = asyncio.Event()
    base = FakeEngine("m1-base", gate=gate)
    async with harness(base=base, server={"max_concurrency": 1}) as h, aiohttp.ClientSession() as s:
        held = await s.post(
            h.url("/v1/chat/completions"), json={"model": "m1", "messages": MSGS, "stream": True}
        )
        await asyncio.wait_for(base.first_sent.wait(), 5)
        async with s.post(h.url("/v1/chat/completions"), json={"model": "m1", "messages": MSGS}) as r:
            assert r.status == 429
            assert r.headers["Retry-After"] == "1"
            assert _assert_openai_error(await r.json())["type"] == "rate_limit_error"
        gate.set()
        await held.read()
        held.release()
        async with s.post(h.url("/v1/chat/completions"), json={"model": "m1", "messages": MSGS}) as r:
            assert r.status == 200


@pytest.mark.parametrize(
    "auth",
    [None, "Bearer wrong-key-000", "Basic Y2xpZW50LWtleS0wMDAx", "Bearer", f"bearer {KEY}x", "Bearer  "],
)
async def test_bad_or_missing_key_is_401(auth: str | None) -> None:
    headers = {"Authorization": auth} if auth else {}
    async with harness(server={"api_keys": [KEY, "second-key-02"]}) as h:
        status, hdrs, out = await _post(
            h.url("/v1/chat/completions"), json={"model": "m1", "messages": MSGS}, headers=headers
        )
        assert status == 401
        assert _assert_openai_error(out)["code"] == "invalid_api_key"
        assert KEY not in json.dumps(out)
        assert hdrs["WWW-Authenticate"].startswith("Bearer")
        async with aiohttp.ClientSession() as s, s.get(h.url("/v1/models"), headers=headers) as r:
            assert r.status == 401
    assert h.base.requests == [] and h.spec.requests == []


async def test_any_configured_key_is_accepted_case_insensitive_scheme() -> None:
    async with harness(server={"api_keys": [KEY, "second-key-02"]}) as h:
        for auth in (f"Bearer {KEY}", "bearer second-key-02"):
            status, _, _ = await _post(
                h.url("/v1/chat/completions"),
                json={"model": "m1", "messages": MSGS},
                headers={"Authorization": auth},
            )
            assert status == 200


async def test_unknown_path_and_method_are_openai_errors() -> None:
    async with harness() as h, aiohttp.ClientSession() as s:
        async with s.get(h.url("/v1/nope")) as r:
            assert r.status == 404
            assert "no such endpoint" in _assert_openai_error(await r.json())["message"]
        async with s.get(h.url("/v1/chat/completions")) as r:
            assert r.status == 405
            _assert_openai_error(await r.json())


async def test_route_header_forces_and_validates() -> None:
    async with harness() as h:
        ok = {"model": "m1", "messages": MSGS, "temperature": 0.0}
        status, headers, _ = await _post(
            h.url("/v1/chat/completions"), json=ok, headers={"x-specgate-route": "base"}
        )
        assert (
            status == 200
            and headers["x-specgate-route"] == "base"
            and headers["x-specgate-reason"] == "forced"
        )
        status, _, out = await _post(
            h.url("/v1/chat/completions"), json=ok, headers={"x-specgate-route": "gpu"}
        )
        assert status == 400 and _assert_openai_error(out)["param"] == "x-specgate-route"
        # refused params win over a forced spec route
        status, headers, _ = await _post(
            h.url("/v1/chat/completions"),
            json={**ok, "logit_bias": {"5": 1}},
            headers={"x-specgate-route": "spec"},
        )
        assert headers["x-specgate-route"] == "base" and headers["x-specgate-reason"] == "refused_params"


async def test_route_header_ignored_when_override_disallowed() -> None:
    async with harness(routing={"allow_client_override": False}) as h:
        status, headers, _ = await _post(
            h.url("/v1/chat/completions"),
            json={"model": "m1", "messages": MSGS, "temperature": 0.0},
            headers={"x-specgate-route": "base"},
        )
    assert status == 200 and headers["x-specgate-route"] == "spec"


async def test_no_usable_engine_is_503_quickly() -> None:
    from gateway.api.state import STATE

    async with harness() as h:
        for rt in h.app[STATE].models["m1"].engines.values():
            rt.draining = True
        status, headers, out = await _post(
            h.url("/v1/chat/completions"), json={"model": "m1", "messages": MSGS}
        )
    assert status == 503
    assert headers["Retry-After"] == "1"
    assert _assert_openai_error(out)["code"] == "no_engine_available"


def _other_model(h_url_spec: str, h_url_base: str, name: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "pairs": [
            {
                "spec": {
                    "name": f"{name}-s",
                    "url": h_url_spec,
                    "served_model_name": "m1-spec",
                    "method": "ngram",
                    "k": 5,
                },
                "base": {"name": f"{name}-b", "url": h_url_base, "served_model_name": "m1-base"},
            }
        ],
        **extra,
    }


async def test_per_model_keys_and_server_keys() -> None:
    # m1 has its own key; m2 is open to any server key; the server key may use both.
    dead = "http://127.0.0.1:9"
    other = _other_model(dead, dead, "m2")
    async with harness(
        server={"api_keys": ["server-key-01"]}, model={"api_keys": ["tenant-key-1"]}, extra_models=[other]
    ) as h:
        url = h.url("/v1/chat/completions")
        body = {"model": "m1", "messages": MSGS}
        for key, status in (("tenant-key-1", 200), ("server-key-01", 200), ("nobody-key-0", 401)):
            got, _, _ = await _post(url, json=body, headers={"Authorization": f"Bearer {key}"})
            assert got == status, key
        # the tenant key cannot use m2, and is told it does not exist (no disclosure)
        got, _, out = await _post(
            url, json={"model": "m2", "messages": MSGS}, headers={"Authorization": "Bearer tenant-key-1"}
        )
        assert got == 404 and _assert_openai_error(out)["code"] == "model_not_found"
        async with aiohttp.ClientSession() as s:
            async with s.get(h.url("/v1/models"), headers={"Authorization": "Bearer server-key-01"}) as r:
                assert [m["id"] for m in (await r.json())["data"]] == ["m1", "m2"]
            async with s.get(h.url("/v1/models"), headers={"Authorization": "Bearer tenant-key-1"}) as r:
                assert [m["id"] for m in (await r.json())["data"]] == ["m1"]
            # one model's card: another tenant's model is not found, as if it did not exist
            tenant = {"Authorization": "Bearer tenant-key-1"}
            async with s.get(h.url("/v1/models/m1"), headers=tenant) as r:
                assert r.status == 200 and (await r.json())["id"] == "m1"
            async with s.get(h.url("/v1/models/m2"), headers=tenant) as r:
                assert r.status == 404 and _assert_openai_error(await r.json())["code"] == "model_not_found"
            async with s.get(h.url("/v1/models/m2"), headers={"Authorization": "Bearer server-key-01"}) as r:
                assert r.status == 200 and (await r.json())["id"] == "m2"
        # unknown model names do not list the other tenants' models
        got, _, out = await _post(
            url, json={"model": "zz", "messages": MSGS}, headers={"Authorization": "Bearer tenant-key-1"}
        )
        assert got == 404 and "m2" not in _assert_openai_error(out)["message"]


async def test_model_keys_without_server_keys_leave_other_models_open() -> None:
    dead = "http://127.0.0.1:9"
    async with harness(
        model={"api_keys": ["tenant-key-1"]}, extra_models=[_other_model(dead, dead, "m2")]
    ) as h:
        url = h.url("/v1/chat/completions")
        got, _, _ = await _post(url, json={"model": "m1", "messages": MSGS})
        assert got == 401
        got, _, _ = await _post(
            url, json={"model": "m1", "messages": MSGS}, headers={"Authorization": "Bearer tenant-key-1"}
        )
        assert got == 200
        got, _, out = await _post(url, json={"model": "m2", "messages": MSGS})
        assert got != 401, out  # m2 needs no key (its engines are down: 502/503)


async def test_per_model_concurrency_limit() -> None:
    gate = asyncio.Event()
    base = FakeEngine("m1-base", gate=gate)
    async with harness(base=base, model={"max_concurrency": 1}) as h, aiohttp.ClientSession() as s:
        held = await s.post(
            h.url("/v1/chat/completions"), json={"model": "m1", "messages": MSGS, "stream": True}
        )
        await asyncio.wait_for(base.first_sent.wait(), 5)
        async with s.post(h.url("/v1/chat/completions"), json={"model": "m1", "messages": MSGS}) as r:
            assert r.status == 429 and r.headers["Retry-After"] == "1"
            assert "m1" in _assert_openai_error(await r.json())["message"]
        gate.set()
        await held.read()
        held.release()
        from gateway.api.state import STATE

        assert h.app[STATE].models["m1"].inflight == 0
        async with s.post(h.url("/v1/chat/completions"), json={"model": "m1", "messages": MSGS}) as r:
            assert r.status == 200
