"""Who may steer the gateway over HTTP: client route overrides (off by default, or limited
to listed keys; an operator's pin wins) and key-less admin (a loopback listener, a
loopback peer, no proxy header; ``serve`` warns when it is open)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any
from unittest import mock

import aiohttp
import pytest
from aiohttp.test_utils import make_mocked_request
from pydantic import SecretStr, ValidationError

from gateway.api.auth import check_admin, is_loopback_host
from gateway.config import load_config
from gateway.config.models import ServerConfig
from gateway.routing.config import RoutingConfig
from gateway.wire.errors import ApiError
from gateway.wire.headers import PROXY_HEADERS
from tests.proxy.harness import harness

MSGS = [{"role": "user", "content": "hi"}]
HOT = {"model": "m1", "messages": MSGS, "temperature": 0.0}  # the temperature policy: spec
KEY, OTHER = "client-key-override", "client-key-plain"


async def _route(url: str, headers: dict[str, str]) -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as s, s.post(url, json=HOT, headers=headers) as r:
        await r.read()
        return r.status, r.headers.get("x-specgate-route", ""), r.headers.get("x-specgate-reason", "")


def test_client_overrides_are_off_in_the_default_configuration() -> None:
    routing = load_config(None, env={}).models[0].routing
    assert routing.allow_client_override is False and routing.override_keys == []
    assert RoutingConfig().allow_client_override is False
    with pytest.raises(ValidationError):  # keys without the switch: a misconfiguration
        RoutingConfig(override_keys=[SecretStr("k")])


async def test_the_header_is_ignored_by_default() -> None:
    async with harness(routing={"allow_client_override": False}) as h:
        status, route, reason = await _route(h.url("/v1/chat/completions"), {"x-specgate-route": "base"})
    assert (status, route) == (200, "spec") and reason != "forced"


async def test_override_keys_limit_the_header_to_the_keys_listed() -> None:
    routing = {"allow_client_override": True, "override_keys": [KEY]}
    async with harness(routing=routing, server={"api_keys": [KEY, OTHER]}) as h:
        url = h.url("/v1/chat/completions")
        allowed = {"x-specgate-route": "base", "Authorization": f"Bearer {KEY}"}
        assert await _route(url, allowed) == (200, "base", "forced")
        other = {"x-specgate-route": "base", "Authorization": f"Bearer {OTHER}"}
        status, route, reason = await _route(url, other)
        assert (status, route) == (200, "spec") and reason != "forced"


async def test_an_operators_pin_wins_over_a_clients_header() -> None:
    async with harness() as h, aiohttp.ClientSession() as s:  # the harness allows overrides
        async with s.post(h.url("/admin/route"), json={"model": "m1", "route": "base"}) as r:
            assert r.status == 200, await r.text()
        status, route, reason = await _route(h.url("/v1/chat/completions"), {"x-specgate-route": "spec"})
        assert (status, route, reason) == (200, "base", "pinned")
        async with s.post(h.url("/admin/route"), json={"model": "m1", "route": "auto"}) as r:
            assert r.status == 200
        assert await _route(h.url("/v1/chat/completions"), {"x-specgate-route": "base"}) == (
            200,
            "base",
            "forced",
        )


def _req(remote: str, headers: dict[str, str] | None = None) -> Any:
    req = make_mocked_request("GET", "/admin/state", headers=headers or {})
    return mock.Mock(wraps=req, remote=remote, headers=req.headers)


LOOPBACK = ServerConfig(host="127.0.0.1")


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_keyless_admin_answers_a_direct_loopback_client_of_a_loopback_listener(host: str) -> None:
    assert is_loopback_host(host)
    check_admin(_req("127.0.0.1"), ServerConfig(host=host))


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.0.0.5", "gateway.internal"])
def test_keyless_admin_is_closed_on_a_listener_others_reach(host: str) -> None:
    with pytest.raises(ApiError) as exc:
        check_admin(_req("127.0.0.1"), ServerConfig(host=host))
    assert (exc.value.status, exc.value.code) == (403, "forbidden")


def test_keyless_admin_refuses_a_peer_off_loopback() -> None:
    with pytest.raises(ApiError) as exc:
        check_admin(_req("10.1.2.3"), LOOPBACK)
    assert exc.value.status == 403


@pytest.mark.parametrize("header", sorted(PROXY_HEADERS))
def test_keyless_admin_refuses_a_request_a_proxy_relayed(header: str) -> None:
    with pytest.raises(ApiError) as exc:
        check_admin(_req("127.0.0.1", {header: "203.0.113.7"}), LOOPBACK)
    assert exc.value.status == 403


async def test_a_local_reverse_proxy_does_not_open_admin() -> None:
    """Through a real socket: the same loopback peer, with and without X-Forwarded-For."""
    async with harness() as h, aiohttp.ClientSession() as s:
        async with s.get(h.url("/admin/state")) as r:
            assert r.status == 200
        async with s.get(h.url("/admin/state"), headers={"X-Forwarded-For": "203.0.113.7"}) as r:
            assert r.status == 403
            assert (await r.json())["error"]["code"] == "forbidden"
        pin = {"model": "m1", "route": "spec"}
        async with s.post(h.url("/admin/route"), json=pin, headers={"Forwarded": "for=203.0.113.7"}) as r:
            assert r.status == 403


def test_an_admin_key_is_needed_whatever_the_listener() -> None:
    keyed = ServerConfig(host="127.0.0.1", admin_keys=[SecretStr("admin-key-0001")])
    with pytest.raises(ApiError) as exc:
        check_admin(_req("127.0.0.1"), keyed)
    assert exc.value.status == 401
    check_admin(_req("10.1.2.3", {"Authorization": "Bearer admin-key-0001", "Via": "1.1 lb"}), keyed)


async def test_serve_warns_when_admin_or_overrides_are_open(caplog: pytest.LogCaptureFixture) -> None:
    from gateway.api.cli_serve import serve

    async def started(**over: Any) -> list[str]:
        cfg = load_config(None, env={}, overrides={"server.port": 0, "scrape.enabled": False, **over})
        caplog.clear()
        ready = asyncio.Event()
        task = asyncio.create_task(serve(cfg, ready=ready))
        await ready.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]

    caplog.set_level(logging.WARNING, logger="gateway")
    warned = await started()
    assert any("admin endpoints" in w for w in warned)
    assert not any("x-specgate-route" in w for w in warned)
    warned = await started(**{"server.admin_keys": ["admin-key-0001"]})
    assert not any("admin endpoints" in w for w in warned)
    warned = await started(**{"server.host": "0.0.0.0"})
    assert not any("admin endpoints" in w for w in warned)  # closed: nothing open to warn of
    warned = await started(**{"models.0.routing.allow_client_override": True})
    assert any("x-specgate-route" in w for w in warned)
