"""/v1/models, /health, /ready, /metrics, /admin/state and /admin/route."""

from __future__ import annotations

import asyncio
import socket
from typing import Any
from unittest import mock

import aiohttp
import pytest
from aiohttp.test_utils import make_mocked_request
from pydantic import SecretStr

from gateway.api.auth import check_admin, is_loopback
from gateway.config.models import ServerConfig
from gateway.wire.errors import ApiError
from tests.proxy.fake_engine import FakeEngine
from tests.proxy.harness import harness

ADMIN = "admin-key-0001"
MSGS = [{"role": "user", "content": "hi"}]


async def _get(url: str, **kw: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as s, s.get(url, **kw) as r:
        return r.status, await r.json(content_type=None)


async def test_models_list_in_openai_shape() -> None:
    async with harness() as h:
        status, body = await _get(h.url("/v1/models"))
    assert status == 200
    assert body["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"]) for m in body["data"]] == [("m1", "model", "specgate")]
    assert isinstance(body["data"][0]["created"], int)


async def test_health_is_process_liveness_even_with_dead_engines() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    async with harness(spec_url=dead, base_url=dead) as h:
        status, body = await _get(h.url("/health"))
        assert status == 200 and body == {"status": "ok"}
        status, body = await _get(h.url("/ready"))
        assert status == 503 and body["status"] == "not_ready"
        assert body["models"]["m1"]["engines"] == {"spec0": False, "base0": False}


async def test_ready_when_one_engine_of_the_model_answers() -> None:
    spec = FakeEngine("m1-spec", health_status=500)
    async with harness(spec=spec) as h:
        status, body = await _get(h.url("/ready"))
    assert status == 200
    assert body["models"]["m1"] == {"ready": True, "engines": {"spec0": False, "base0": True}}


async def test_admin_state_and_route_pinning_on_loopback() -> None:
    async with harness() as h, aiohttp.ClientSession() as s:
        async with s.post(h.url("/admin/route"), json={"model": "m1", "route": "base"}) as r:
            assert r.status == 200
            assert await r.json() == {"model": "m1", "route": "base", "previous": "auto"}
        # pinned: a low-temperature request that would speculate goes to the plain engine
        body = {"model": "m1", "messages": MSGS, "temperature": 0.0}
        async with s.post(h.url("/v1/chat/completions"), json=body) as r:
            assert r.headers["x-specgate-route"] == "base" and r.headers["x-specgate-reason"] == "pinned"
        status, state = await _get(h.url("/admin/state"))
        assert status == 200
        m = state["models"]["m1"]
        assert m["pinned"] == "base" and m["policy"] == "temperature"
        assert m["pairs"][0]["spec"]["name"] == "spec0" and m["pairs"][0]["spec"]["k"] == 5
        assert m["pairs"][0]["base"]["total_requests"] == 1
        assert m["pairs"][0]["base"]["inflight"] == 0
        assert m["policy_state"] == {"policy": "temperature"} or isinstance(m["policy_state"], dict)
        async with s.post(h.url("/admin/route"), json={"model": "m1", "route": "sideways"}) as r:
            assert r.status == 400
        async with s.post(h.url("/admin/route"), json={"model": "nope", "route": "auto"}) as r:
            assert r.status == 404
        async with s.post(h.url("/admin/route"), json={"model": "m1", "route": "auto"}) as r:
            assert (await r.json())["previous"] == "base"


async def test_admin_needs_admin_key_when_configured() -> None:
    async with harness(server={"admin_keys": [ADMIN], "api_keys": ["client-key-0001"]}) as h:
        status, body = await _get(h.url("/admin/state"))
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        # a client key is not an admin key
        status, _ = await _get(h.url("/admin/state"), headers={"Authorization": "Bearer client-key-0001"})
        assert status == 401
        status, _ = await _get(h.url("/admin/state"), headers={"Authorization": f"Bearer {ADMIN}"})
        assert status == 200


def _req(remote: str) -> Any:
    req = make_mocked_request("GET", "/admin/state")
    return mock.Mock(wraps=req, remote=remote, headers=req.headers)


@pytest.mark.parametrize(
    ("remote", "ok"), [("127.0.0.1", True), ("::1", True), ("10.1.2.3", False), ("", False)]
)
def test_admin_without_key_is_loopback_only(remote: str, ok: bool) -> None:
    req = _req(remote)
    assert is_loopback(req) is ok
    if ok:
        check_admin(req, ServerConfig())
    else:
        with pytest.raises(ApiError) as e:
            check_admin(req, ServerConfig())
        assert e.value.status == 403
    with pytest.raises(ApiError):
        # with a key configured, loopback is not enough
        check_admin(req, ServerConfig(admin_keys=[SecretStr(ADMIN)]))


async def test_metrics_endpoint_and_optional_key() -> None:
    async with harness() as h, aiohttp.ClientSession() as s, s.get(h.url("/metrics")) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/plain")
    async with (
        harness(server={"metrics_require_key": True, "api_keys": ["client-key-0001"]}) as h,
        aiohttp.ClientSession() as s,
    ):
        async with s.get(h.url("/metrics")) as r:
            assert r.status == 401
        async with s.get(h.url("/metrics"), headers={"Authorization": "Bearer client-key-0001"}) as r:
            assert r.status == 200


async def test_inflight_counts_are_exact_while_streaming() -> None:
    from gateway.api.state import STATE

    gate = asyncio.Event()
    base = FakeEngine("m1-base", gate=gate)
    async with harness(base=base) as h, aiohttp.ClientSession() as s:
        r = await s.post(
            h.url("/v1/chat/completions"), json={"model": "m1", "messages": MSGS, "stream": True}
        )
        await asyncio.wait_for(base.first_sent.wait(), 5)
        st = h.app[STATE]
        assert st.inflight == 1
        assert st.models["m1"].engines["base0"].inflight == 1
        assert st.models["m1"].view(0.0).pairs[0].base.inflight == 1
        gate.set()
        await r.read()
        r.release()
        assert st.models["m1"].engines["base0"].inflight == 0


async def test_admin_drain_moves_traffic_off_an_engine_and_back() -> None:
    async with harness() as h, aiohttp.ClientSession() as s:
        body = {"model": "m1", "messages": MSGS, "temperature": 0.0}
        async with s.post(h.url("/admin/drain"), json={"engine": "spec0", "draining": True}) as r:
            assert r.status == 200 and (await r.json())["draining"] is True
        async with s.post(h.url("/v1/chat/completions"), json=body) as r:
            assert r.headers["x-specgate-route"] == "base" and r.headers["x-specgate-reason"] == "spec_down"
        status, state = await _get(h.url("/admin/state"))
        assert status == 200 and state["models"]["m1"]["pairs"][0]["spec"]["draining"] is True
        async with s.post(h.url("/admin/drain"), json={"engine": "spec0", "draining": False}) as r:
            assert r.status == 200
        async with s.post(h.url("/v1/chat/completions"), json=body) as r:
            assert r.headers["x-specgate-route"] == "spec"
        async with s.post(h.url("/admin/drain"), json={"engine": "nope"}) as r:
            assert r.status == 404
        async with s.post(h.url("/admin/drain"), json={"engine": "spec0", "draining": "yes"}) as r:
            assert r.status == 400
    assert len(h.spec.requests) == 1


@pytest.mark.parametrize("path", ["/admin/route", "/admin/drain"])
async def test_admin_posts_reject_oversized_and_malformed_bodies(path: str) -> None:
    async with harness() as h, aiohttp.ClientSession() as s:
        async with s.post(h.url(path), data=b"{" + b" " * (64 * 1024 + 1) + b"}") as r:
            assert r.status == 413
            assert (await r.json())["error"]["code"] == "request_too_large"
        async with s.post(h.url(path), data=b"{not json") as r:
            assert r.status == 400
