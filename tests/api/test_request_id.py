"""Every response carries ``x-request-id``: every route the gateway registers, its errors
(404, 405, 401) and its streams; the client's id when it is safe, else a fresh one."""

from __future__ import annotations

import re

import aiohttp
import pytest

from tests.proxy.harness import harness

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.0}
BODIES = {
    "/v1/chat/completions": CHAT,
    "/v1/completions": {"model": "m1", "prompt": "hi", "max_tokens": 4},
    "/admin/route": {"model": "m1", "route": "auto"},
    "/admin/drain": {"engine": "base0", "draining": False},
}
_FRESH = re.compile(r"^[0-9a-f]{32}$")


@pytest.mark.parametrize("client_id", ["client-rid.1:x", "bad id with spaces", None])
async def test_every_route_answers_with_a_request_id(client_id: str | None) -> None:
    headers = {"x-request-id": client_id} if client_id else {}
    async with harness() as h, aiohttp.ClientSession() as s:
        routes = sorted(
            {(r.method, r.resource.canonical) for r in h.app.router.routes() if r.resource is not None}
        )
        calls = [(m, p, BODIES.get(p)) for m, p in routes if m != "HEAD"]
        assert len(calls) >= 9, calls  # the surface, the probes, /metrics and the admin routes
        calls += [("GET", "/no/such/route", None), ("GET", "/v1/chat/completions", None)]  # 404, 405
        calls += [("POST", "/v1/chat/completions", {**CHAT, "stream": True})]
        seen: dict[str, str] = {}
        for method, path, body in calls:
            async with s.request(method, h.url(path), json=body, headers=headers) as r:
                await r.read()
                rid = r.headers.get("x-request-id")
                assert rid is not None, f"{method} {path} -> {r.status} without x-request-id"
                seen[f"{method} {path} {r.status}"] = rid
    for call, rid in seen.items():
        if client_id == "client-rid.1:x":
            assert rid == client_id, call
        else:
            assert _FRESH.fullmatch(rid), (call, rid)
    if client_id != "client-rid.1:x":
        assert len(set(seen.values())) == len(seen)  # a fresh id per request


async def test_a_refused_request_keeps_the_clients_id() -> None:
    async with (
        harness(server={"api_keys": ["client-key-1"]}) as h,
        aiohttp.ClientSession() as s,
        s.get(h.url("/v1/models"), headers={"x-request-id": "rid-401"}) as r,
    ):
        assert r.status == 401
        assert r.headers["x-request-id"] == "rid-401"
