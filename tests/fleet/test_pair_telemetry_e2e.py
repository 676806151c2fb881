"""A fleet of two emulated pairs through the gateway: /metrics and /admin/state show each
pair's regime and load; when a pair leaves, its series go (real sockets)."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import GatewayConfig
from gateway.fleet.registry import CONFIG
from gateway.telemetry import GatewayTelemetry, TelemetryConfig
from tests.fleet.helpers import MODEL, chat, config_data, emulated_pair, gateway, pair_entry
from tests.reliability.rig import until


async def _series(http: aiohttp.ClientSession, url: str) -> dict[str, list[dict[str, str]]]:
    async with http.get(url) as r:
        text = await r.text()
    out: dict[str, list[dict[str, str]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(dict(s.labels, value=str(s.value)))
    return out


async def test_pairs_regimes_and_loads_are_exported_and_a_gone_pairs_series_vanish() -> None:
    ga, gb = await emulated_pair("gpu0"), await emulated_pair("gpu1")
    tel = GatewayTelemetry(TelemetryConfig(process_metrics=False))
    try:
        a, b = pair_entry(ga, "a", "gpu0"), pair_entry(gb, "b", "gpu1")
        config = GatewayConfig.model_validate(config_data([a, b]))
        async with gateway(config, telemetry=tel) as (server, st), aiohttp.ClientSession() as http:
            assert st.fleet is not None
            await until(lambda: all(e.scrape is not None for e in st.engines), what="first scrapes")
            url = str(server.make_url("/v1/chat/completions"))
            for _ in range(4):
                async with http.post(url, json=chat(8)) as r:
                    assert r.status == 200
                    await r.read()
            metrics = str(server.make_url("/metrics"))
            s = await _series(http, metrics)
            assert {x["pair"] for x in s["specgate_pair_speculating"]} == {"a-base", "b-base"}
            assert {x["pair"] for x in s["specgate_pair_load_requests"]} == {"a-base", "b-base"}
            assert [x["value"] for x in s["specgate_fleet_pairs"]] == ["2.0"]
            async with http.get(str(server.make_url("/admin/state"))) as r:
                pairs = (await r.json())["models"][MODEL]["pairs"]
            assert all(isinstance(p["speculating"], bool) and p["load"] is not None for p in pairs)

            st.fleet.declare(
                MODEL, CONFIG, {"b": GatewayConfig.model_validate(config_data([b])).models[0].pairs[0]}
            )
            s = await _series(http, metrics)  # a drains: out of the routing view at once
            assert {x["pair"] for x in s["specgate_pair_load_requests"]} == {"b-base"}
            await st.fleet.wait_gone(MODEL, "a")
            s = await _series(http, metrics)
            engines = {x["engine"] for rows in s.values() for x in rows if "engine" in x}
            assert engines == {"b-spec", "b-base"}  # a's engines' series ended with it
            assert {x["pair"] for rows in s.values() for x in rows if "pair" in x} == {"b-base"}
    finally:
        await ga.stop()
        await gb.stop()
