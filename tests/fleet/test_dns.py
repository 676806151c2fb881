"""Discovery from DNS: the pairing rule, failures that keep or empty the set, the system
resolver on /etc/hosts, and a discovered emulated pair serving then draining."""

from __future__ import annotations

import asyncio
import socket

import aiohttp

from gateway.config import GatewayConfig
from gateway.config.discovery import DiscoveryConfig
from gateway.fleet.dns import DnsSource, system_resolver
from gateway.fleet.registry import PairsChanged
from gateway.fleet.sources import Endpoint, discovered_pair
from gateway.wire.headers import ENGINE
from tests.fleet.helpers import MODEL, chat, config_data, emulated_pair, gateway
from tests.reliability.rig import until


def disc(**kw: object) -> DiscoveryConfig:
    return DiscoveryConfig.model_validate(
        {
            "kind": "dns",
            "host": "qwen3-8b-pair.ns.svc.cluster.local",
            "spec": {"port": 8001, "served_model_name": "qwen3-8b-spec", "method": "ngram", "k": 5},
            "base": {"port": 8002, "served_model_name": "qwen3-8b-base"},
            **kw,
        }
    )


def test_one_address_is_one_pair() -> None:
    p = discovered_pair(MODEL, disc(), Endpoint("10.1.2.3"))
    assert p.key == f"{MODEL}-10.1.2.3" and p.device == p.key
    assert p.spec is not None and p.spec.url == "http://10.1.2.3:8001" and p.spec.endpoint == "10.1.2.3:8001"
    assert p.base.name == f"{MODEL}-10.1.2.3-base" and p.base.url == "http://10.1.2.3:8002"
    v6 = discovered_pair(MODEL, disc(), Endpoint("fd00::7", pod="qwen3-8b-pair-1"))
    assert v6.base.url == "http://[fd00::7]:8002" and v6.device == "qwen3-8b-pair-1"


async def test_a_missing_name_empties_the_set_and_a_resolver_failure_keeps_it() -> None:
    answers: list[list[str] | OSError] = [
        ["10.0.0.2", "10.0.0.1"],
        socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"),
        socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
    ]
    declared: list[list[str]] = []

    async def resolver(host: str) -> list[str]:
        a = answers.pop(0)
        if isinstance(a, OSError):
            raise a
        return a

    src = DnsSource(MODEL, disc(), lambda eps: declared.append([e.address for e in eps]), resolver=resolver)
    assert await src.poll_once() == ["10.0.0.2", "10.0.0.1"]
    assert await src.poll_once() is None
    assert "Temporary failure" in str(src.status["error"])
    assert await src.poll_once() == []
    assert declared == [["10.0.0.2", "10.0.0.1"], []]  # the failure declared nothing


async def test_the_system_resolver_reads_etc_hosts() -> None:
    assert "127.0.0.1" in await system_resolver("localhost")


async def test_a_discovered_pair_serves_and_drains_when_its_address_goes() -> None:
    group = await emulated_pair("gpu0")
    try:
        spec, base = group.engines
        d = {
            "kind": "dns",
            "host": "pairs.test",
            "interval_s": 0.01,
            "spec": {
                "port": int(spec.url.rsplit(":", 1)[1]),
                "served_model_name": "qwen3-8b-spec",
                "method": "ngram",
                "k": 5,
            },
            "base": {"port": int(base.url.rsplit(":", 1)[1]), "served_model_name": "qwen3-8b-base"},
        }
        config = GatewayConfig.model_validate(config_data([], discovery=d))
        pods = ["127.0.0.1"]

        async def resolver(host: str) -> list[str]:
            assert host == "pairs.test"
            return list(pods)

        async with gateway(config, resolver=resolver) as (server, st), aiohttp.ClientSession() as http:
            assert st.fleet is not None
            changes: asyncio.Queue[PairsChanged] = asyncio.Queue()
            st.fleet.listeners.append(changes.put_nowait)
            mrt = st.models[MODEL]
            if not mrt.pairs:  # the first resolution may not have run yet
                assert (await asyncio.wait_for(changes.get(), 10)).names["added"] == [f"{MODEL}-127.0.0.1"]
            pair = mrt.pairs[0]
            await until(lambda: all(e.healthy() for e in pair.engines), what="discovered pair healthy")
            async with http.post(str(server.make_url("/v1/chat/completions")), json=chat(8)) as r:
                assert r.status == 200 and r.headers[ENGINE].startswith(f"{MODEL}-127.0.0.1-")
            async with http.get(str(server.make_url("/admin/state"))) as r:
                state = (await r.json())["models"][MODEL]
            assert state["discovery"]["kind"] == "dns" and state["discovery"]["addresses"] == ["127.0.0.1"]
            assert state["fleet"]["declared"] == {"config": [], "dns": [f"{MODEL}-127.0.0.1"]}

            pods.clear()  # the pod is gone
            got = await asyncio.wait_for(changes.get(), 10)
            assert got.names["leaving"] == [f"{MODEL}-127.0.0.1"]
            await st.fleet.wait_gone(MODEL, f"{MODEL}-127.0.0.1")
            assert mrt.pairs == []
            async with http.post(str(server.make_url("/v1/chat/completions")), json=chat(8)) as r:
                assert r.status == 503  # no pair: nothing to route to, said so
    finally:
        await group.stop()
