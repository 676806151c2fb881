"""Security: keys per surface, secrets never logged, header hygiene, sanitised request ids."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import SecretStr

from gateway import cli
from gateway.api.app import build_app
from gateway.telemetry import GatewayTelemetry, TelemetryConfig
from tests.fuzz.hostile import SAFE_REQUEST_ID, Case, send
from tests.reliability.rig import chat, gateway_config, rig

CLIENT_KEY = "client-key-7f3a9c1e"
ADMIN_KEY = "admin-key-b2d4e6f8"
ENGINE_KEY = "engine-key-0a1b2c3d"
WRONG_KEY = "wrong-key-5e5e5e5e"
PROMPT_CANARY = "PROMPT-CANARY-4242 the secret plan"
KEYS: dict[str, Any] = {
    "server": {"api_keys": [CLIENT_KEY], "admin_keys": [ADMIN_KEY], "metrics_require_key": True}
}


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def _status(s: aiohttp.ClientSession, method: str, url: str, key: str | None, **kw: Any) -> int:
    async with s.request(method, url, headers=_bearer(key) if key else None, **kw) as r:
        body = await r.read()
        if r.status == 401:
            err = json.loads(body)["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["code"] == "invalid_api_key"
        return r.status


async def test_client_keys_on_v1_admin_key_on_admin_and_neither_works_for_the_other() -> None:
    async with rig(**KEYS) as r, aiohttp.ClientSession() as s:
        completions = r.url("/v1/chat/completions")
        body = {"json": chat(max_tokens=3)}
        for method, path, kw in (
            ("POST", "/v1/chat/completions", body),
            ("POST", "/v1/completions", {"json": {"model": "m1", "prompt": "hi", "max_tokens": 3}}),
            ("GET", "/v1/models", {}),
        ):
            assert await _status(s, method, r.url(path), None, **kw) == 401
            assert await _status(s, method, r.url(path), WRONG_KEY, **kw) == 401
            assert (
                await _status(s, method, r.url(path), ADMIN_KEY, **kw) == 401
            )  # admin key is not a client key
            assert await _status(s, method, r.url(path), CLIENT_KEY, **kw) == 200
        assert await _status(s, "POST", completions, CLIENT_KEY.upper(), **body) == 401
        pin = {"json": {"model": "m1", "route": "base"}}
        for method, path, kw in (("GET", "/admin/state", {}), ("POST", "/admin/route", pin)):
            assert await _status(s, method, r.url(path), None, **kw) == 401
            assert await _status(s, method, r.url(path), CLIENT_KEY, **kw) == 401  # client key is not admin
            assert await _status(s, method, r.url(path), ADMIN_KEY, **kw) == 200
        # Liveness stays open for orchestrators; /ready too.
        assert await _status(s, "GET", r.url("/health"), None) == 200


async def test_metrics_protection_is_optional() -> None:
    async with rig(**KEYS) as r, aiohttp.ClientSession() as s:
        assert await _status(s, "GET", r.url("/metrics"), None) == 401
        assert await _status(s, "GET", r.url("/metrics"), WRONG_KEY) == 401
        assert await _status(s, "GET", r.url("/metrics"), CLIENT_KEY) == 200
        assert await _status(s, "GET", r.url("/metrics"), ADMIN_KEY) == 200
    async with rig() as r, aiohttp.ClientSession() as s:
        assert await _status(s, "GET", r.url("/metrics"), None) == 200


async def test_secrets_and_prompts_never_reach_logs_admin_state_or_metrics(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    over: dict[str, Any] = {**KEYS, "retry": {"failures_to_unhealthy": 1}}
    async with rig(**over) as r, aiohttp.ClientSession() as s:
        for e in r.state.engines:  # engines that need a key (sent upstream as Bearer)
            e.config.api_key = SecretStr(ENGINE_KEY)
        req = chat(PROMPT_CANARY, max_tokens=8)
        async with s.post(r.url("/v1/chat/completions"), json=req, headers=_bearer(CLIENT_KEY)) as resp:
            assert resp.status == 200
        async with s.post(r.url("/v1/chat/completions"), json=req, headers=_bearer(WRONG_KEY)) as resp:
            assert resp.status == 401
        # Failure paths log warnings: a failing engine, then both down.
        r.faults("qwen3-8b-spec", error_rate=1.0)
        stream = {**chat(PROMPT_CANARY, max_tokens=8, temperature=0.0), "stream": True}
        async with s.post(r.url("/v1/chat/completions"), json=stream, headers=_bearer(CLIENT_KEY)) as resp:
            assert resp.status == 200
        await r.crash("qwen3-8b-base")
        await r.crash("qwen3-8b-spec")
        async with s.post(r.url("/v1/chat/completions"), json=req, headers=_bearer(CLIENT_KEY)) as resp:
            assert resp.status == 503
        async with s.get(r.url("/admin/state"), headers=_bearer(ADMIN_KEY)) as resp:
            state = await resp.text()
        async with s.get(r.url("/metrics"), headers=_bearer(ADMIN_KEY)) as resp:
            metrics = await resp.text()
    logged = caplog.text  # every record, formatted, with any traceback
    assert caplog.records, "nothing was logged: the test would prove nothing"
    for secret in (CLIENT_KEY, ADMIN_KEY, ENGINE_KEY, WRONG_KEY, PROMPT_CANARY, "PROMPT-CANARY"):
        assert secret not in logged, f"{secret} logged"
        assert secret not in state, f"{secret} in /admin/state"
        assert secret not in metrics, f"{secret} in /metrics"


def test_config_check_masks_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = gateway_config("http://127.0.0.1:1", "http://127.0.0.1:2", **KEYS).model_dump(mode="python")
    cfg["server"]["api_keys"] = [CLIENT_KEY]
    cfg["server"]["admin_keys"] = [ADMIN_KEY]
    cfg["models"][0]["pairs"][0]["spec"]["api_key"] = ENGINE_KEY
    cfg["models"][0]["pairs"][0]["base"]["api_key"] = None
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump(json.loads(json.dumps(cfg, default=str))))
    assert cli.main(["serve", "--config", str(path), "--check"]) == 0
    out = capsys.readouterr()
    assert "api_keys" in out.out
    for secret in (CLIENT_KEY, ADMIN_KEY, ENGINE_KEY):
        assert secret not in out.out + out.err


# -- header hygiene against a recording upstream --------------------------------------------


class Recorder:
    """An engine that records request headers and answers with headers a client must not get."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/health", self._health)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response()

    async def _chat(self, request: web.Request) -> web.Response:
        await request.read()
        self.seen.append({k.lower(): v for k, v in request.headers.items()})
        body = {
            "id": "c",
            "object": "chat.completion",
            "model": "served",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        resp = web.json_response(body)
        resp.headers["Set-Cookie"] = "engine_session=abc"
        resp.headers["X-Specgate-Route"] = "spoofed-by-engine"
        resp.headers["Connection"] = "keep-alive, X-Engine-Hop"
        resp.headers["X-Engine-Hop"] = "hop"
        resp.headers["X-Engine-Info"] = "end-to-end"
        return resp


@asynccontextmanager
async def _recorded(**over: Any) -> AsyncIterator[tuple[Recorder, TestServer]]:
    rec = Recorder()
    up = TestServer(rec.app())
    await up.start_server()
    url = str(up.make_url("")).rstrip("/")
    tel = GatewayTelemetry(TelemetryConfig(process_metrics=False, known_models=("m1",)))
    gw = TestServer(build_app(gateway_config(url, url, scrape={"enabled": False}, **over), telemetry=tel))
    await gw.start_server()
    try:
        yield rec, gw
    finally:
        await gw.close()
        await up.close()
        await tel.aclose()


SPOOFABLE = {
    "X-Forwarded-For": "10.6.6.6",
    "X-Forwarded-Host": "evil.example",
    "X-Forwarded-Proto": "https",
    "Forwarded": "for=10.6.6.6;by=evil",
    "X-Real-IP": "10.6.6.6",
    "X-Client-IP": "10.6.6.6",
    "True-Client-IP": "10.6.6.6",
    "X-Original-URL": "/admin/state",
    "X-HTTP-Method-Override": "DELETE",
    "X-Specgate-Engine": "spoofed",
    "X-Specgate-Reason": "spoofed",
    "Proxy-Authorization": "Basic Zm9vOmJhcg==",
    "Cookie": "session=victim",
    "X-Api-Key": CLIENT_KEY,
    "Api-Key": CLIENT_KEY,
    "Connection": "keep-alive, X-Drop-Me",
    "X-Drop-Me": "hop",
    "Keep-Alive": "timeout=5",
    "TE": "trailers",
    "Upgrade": "h2c",
    "Expect": "",
}


async def test_hop_by_hop_spoofable_and_credential_headers_are_not_forwarded() -> None:
    # Only allow-listed headers go upstream; x-custom-trace and x-drop-me are named in
    # server.forward_headers, and x-drop-me is still dropped because Connection lists it.
    server = {**KEYS["server"], "forward_headers": ["X-Custom-Trace", "x-drop-me"]}
    async with _recorded(server=server) as (rec, gw), aiohttp.ClientSession() as s:
        headers = {**SPOOFABLE, **_bearer(CLIENT_KEY), "X-Custom-Trace": "keep", "Host": "client.example"}
        headers.pop("Expect")
        async with s.post(gw.make_url("/v1/chat/completions"), json=chat(), headers=headers) as r:
            assert r.status == 200
            got = {k.lower(): v for k, v in r.headers.items()}
    seen = rec.seen[0]
    for name in SPOOFABLE:
        if name.lower() not in ("connection", "keep-alive"):
            assert name.lower() not in seen, f"{name} forwarded to the engine"
    assert "authorization" not in seen  # the client's key never reaches the engine
    assert seen.get("x-custom-trace") == "keep"  # a configured end-to-end header passes
    assert seen["host"] != "client.example"
    # From the engine to the client: no cookies, no hop-by-hop, no spoofed routing headers.
    assert "set-cookie" not in got and "x-engine-hop" not in got
    assert got["x-specgate-route"] in ("spec", "base")
    assert got.get("x-engine-info") == "end-to-end"


_RIDS = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=200
) | st.sampled_from(
    ["ok-id.1:2", "a" * 128, "a" * 129, "../../etc", "id with space", "<script>", "%0d%0a", "é-id"]
)


async def test_request_ids_are_sanitised() -> None:
    async with _recorded() as (rec, gw):
        port = gw.port or 0

        @settings(max_examples=150, derandomize=True, deadline=None, database=None)
        @given(rid=_RIDS)
        def prop(rid: str) -> None:
            case = Case("/v1/chat/completions", json.dumps(chat()).encode(), {"x-request-id": rid})
            status, headers, _ = send("127.0.0.1", port, case)
            assert status == 200
            back, upstream = headers["x-request-id"], rec.seen[-1]["x-request-id"]
            assert SAFE_REQUEST_ID.fullmatch(back)
            assert back == upstream  # the engine and the client see the same, safe id
            if re.fullmatch(r"[A-Za-z0-9._:\-]{1,128}", rid):
                assert back == rid  # a safe id is kept, for correlation
            else:
                assert back != rid

        await asyncio.to_thread(prop)
        assert len(rec.seen) >= 150
