"""A pair leaves while a stream runs on it: the stream finishes there, nothing new goes to
it, and once idle it is gone; a pair joins and serves (real emulated pairs, real sockets)."""

from __future__ import annotations

import aiohttp

from gateway.api.app import WORKERS
from gateway.config import GatewayConfig
from gateway.fleet.registry import CONFIG, PairsChanged
from gateway.wire.headers import ENGINE
from tests.fleet.helpers import (
    MODEL,
    chat,
    config_data,
    emulated_pair,
    gateway,
    pair_entry,
    read_stream,
)
from tests.reliability.rig import until


async def test_a_leaving_pair_drains_its_stream_and_a_joining_pair_takes_new_requests() -> None:
    # pair a runs 4x slower than b: its 1000-token stream is still decoding when it leaves
    ga, gb = await emulated_pair("gpu0", time_scale=0.2), await emulated_pair("gpu1")
    try:
        a, b = pair_entry(ga, "a", "gpu0"), pair_entry(gb, "b", "gpu1")
        config = GatewayConfig.model_validate(config_data([a]))
        async with gateway(config) as (server, st), aiohttp.ClientSession() as http:
            assert st.fleet is not None
            changes: list[PairsChanged] = []
            st.fleet.listeners.append(changes.append)
            await until(lambda: all(e.scrape is not None for e in st.engines), what="first scrapes")
            url = str(server.make_url("/v1/chat/completions"))
            body = chat(1000, stream=True, ignore_eos=True, stream_options={"include_usage": True})
            async with http.post(url, json=body) as long:
                assert long.status == 200 and long.headers[ENGINE].startswith("a-")
                await long.content.readline()  # the answer has begun on pair a
                assert server.app[WORKERS].watched == {"a-spec", "a-base"}

                # the config now lists b instead of a
                change = st.fleet.declare(
                    MODEL, CONFIG, {"b": GatewayConfig.model_validate(config_data([b])).models[0].pairs[0]}
                )
                assert change.names == {"added": ["b"], "leaving": ["a"], "gone": []}
                mrt = st.models[MODEL]
                pa = next(p for p in mrt.pairs if p.name == "a")
                assert pa.leaving and pa.inflight == 1
                assert [p.device for p in mrt.view(0.0).pairs] == ["gpu1"]  # a is out of the routing view

                async with http.get(str(server.make_url("/admin/state"))) as r:
                    state = await r.json()
                pairs = {p["name"]: p["status"] for p in state["models"][MODEL]["pairs"]}
                assert pairs == {"a": "draining", "b": "active"}
                assert state["models"][MODEL]["fleet"]["draining"] == ["a"]

                # b serves once its first health check answered; every new request goes there
                pb = next(p for p in mrt.pairs if p.name == "b")
                await until(lambda: all(e.healthy() for e in pb.engines), what="b healthy")
                for route in ("spec", "base", "auto"):
                    async with http.post(url, json=chat(8), headers={"x-specgate-route": route}) as r:
                        assert r.status == 200
                        assert r.headers[ENGINE].startswith("b-"), (route, r.headers[ENGINE])
                        await r.read()

                # a's stream was never cut: it ends whole, on a
                tokens, done, errors = await read_stream(long)
                assert (tokens, done, errors) == (1000, True, [])

            await st.fleet.wait_gone(MODEL, "a")
            assert [p.name for p in mrt.pairs] == ["b"]
            assert set(mrt.engines) == {"b-spec", "b-base"}
            assert [c.names["gone"] for c in changes] == [[], ["a"]]
            assert server.app[WORKERS].watched == {"b-spec", "b-base"}  # a's scrapers stopped
            async with http.get(str(server.make_url("/admin/state"))) as r:
                state = await r.json()
            assert [p["name"] for p in state["models"][MODEL]["pairs"]] == ["b"]
    finally:
        await ga.stop()
        await gb.stop()
