"""Discovery from the Kubernetes API (kubernetes_asyncio) against a fake API server: the
EndpointSlice list, then watch events ADDED / MODIFIED / DELETED; a broken watch relists."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.config.discovery import DiscoveryConfig
from gateway.fleet.k8s import KubernetesSource, endpoints_of
from gateway.fleet.sources import Endpoint
from tests.reliability.rig import until

pytest.importorskip("kubernetes_asyncio")

NS = "specgate"
PATH = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"


def endpoint(ip: str, pod: str, *, terminating: bool = False) -> dict[str, Any]:
    return {
        "addresses": [ip],
        "conditions": {"ready": True, "serving": True, "terminating": terminating},
        "targetRef": {"kind": "Pod", "name": pod, "namespace": NS},
    }


def slice_(name: str, rv: str, *eps: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": NS,
            "resourceVersion": rv,
            "labels": {"kubernetes.io/service-name": "qwen3-8b-pair"},
        },
        "addressType": "IPv4",
        "ports": [
            {"name": "spec", "port": 8001, "protocol": "TCP"},
            {"name": "base", "port": 8002, "protocol": "TCP"},
        ],
        "endpoints": list(eps),
    }


class FakeApiServer:
    """GET the slices: the list, or (watch=true) a stream of the events put in ``events``
    (None ends the stream, as the API server's timeout does)."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items
        self.events: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.requests: list[dict[str, str]] = []
        app = web.Application()
        app.router.add_get(PATH, self.handle)
        self.server = TestServer(app)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(dict(request.query))
        if request.query.get("watch") not in ("true", "True", "1"):
            return web.json_response(
                {
                    "kind": "EndpointSliceList",
                    "apiVersion": "discovery.k8s.io/v1",
                    "metadata": {"resourceVersion": "10"},
                    "items": self.items,
                }
            )
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        while (event := await self.events.get()) is not None:
            await resp.write(json.dumps(event).encode() + b"\n")
        await resp.write_eof()
        return resp


def config(api: str) -> DiscoveryConfig:
    return DiscoveryConfig.model_validate(
        {
            "kind": "kubernetes",
            "api_server": api,
            "namespace": NS,
            "service": "qwen3-8b-pair",
            "interval_s": 0.01,
            "spec": {"port": 1, "port_name": "spec", "served_model_name": "s", "method": "ngram", "k": 5},
            "base": {"port": 2, "port_name": "base", "served_model_name": "b"},
        }
    )


def test_each_endpoint_is_a_pair_and_terminating_pods_are_left_out() -> None:
    slices = {
        "s1": slice_("s1", "1", endpoint("10.0.0.1", "p-0"), endpoint("10.0.0.2", "p-1", terminating=True)),
        "s2": slice_("s2", "1", endpoint("10.0.0.3", "p-2")),
    }
    cfg = config("http://x")
    assert endpoints_of(slices, cfg) == [
        Endpoint("10.0.0.1", "p-0", 8001, 8002),
        Endpoint("10.0.0.3", "p-2", 8001, 8002),
    ]


async def test_the_source_lists_then_follows_the_watch_and_relists_after_it_ends() -> None:
    api = FakeApiServer([slice_("s1", "5", endpoint("10.0.0.1", "p-0"))])
    await api.server.start_server()
    declared: asyncio.Queue[list[str]] = asyncio.Queue()
    src = KubernetesSource(
        "m", config(str(api.server.make_url(""))), lambda eps: declared.put_nowait([e.pod or "" for e in eps])
    )
    task = asyncio.create_task(src.run())
    try:
        assert await asyncio.wait_for(declared.get(), 10) == ["p-0"]  # the list
        events = [
            ("ADDED", slice_("s2", "11", endpoint("10.0.0.2", "p-1"))),
            ("MODIFIED", slice_("s1", "12", endpoint("10.0.0.1", "p-0", terminating=True))),
            ("DELETED", slice_("s2", "13")),
        ]
        expected = [["p-0", "p-1"], ["p-1"], []]
        for (kind, obj), want in zip(events, expected, strict=True):
            api.events.put_nowait({"type": kind, "object": obj})
            assert await asyncio.wait_for(declared.get(), 10) == want
        watch = api.requests[1]
        assert watch["labelSelector"] == "kubernetes.io/service-name=qwen3-8b-pair"
        assert watch["resourceVersion"] == "10" and watch["timeoutSeconds"] == "300"
        # the server ends the watch: the source lists afresh (the list says p-0 again)
        src.listed.clear()
        api.events.put_nowait(None)
        await asyncio.wait_for(src.listed.wait(), 10)
        assert await asyncio.wait_for(declared.get(), 10) == ["p-0"]
        assert src.status["lists"] == 2 and src.status["error"] is None
    finally:
        task.cancel()
        api.events.put_nowait(None)
        await asyncio.gather(task, return_exceptions=True)
        await api.server.close()


async def test_an_api_error_keeps_the_last_pairs_and_is_reported() -> None:
    app = web.Application()

    async def forbidden(request: web.Request) -> web.Response:
        return web.json_response({"kind": "Status", "code": 403, "reason": "Forbidden"}, status=403)

    app.router.add_get(PATH, forbidden)
    server = TestServer(app)
    await server.start_server()
    declared: list[list[Endpoint]] = []
    src = KubernetesSource("m", config(str(server.make_url(""))), declared.append)
    task = asyncio.create_task(src.run())
    try:
        await until(lambda: src.status["error"] is not None, what="the error reported")
        assert "HTTP 403" in str(src.status["error"]) and declared == []  # not "no pods"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await server.close()
