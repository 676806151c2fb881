"""FleetRegistry without sockets: joins, drains, pending and refused pairs, the drain timeout."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.config import GatewayConfig, PairConfig
from gateway.config.discovery import FleetConfig
from gateway.engines.runtime import ModelRuntime, PairRuntime
from gateway.fleet.registry import CONFIG, FleetRegistry, PairsChanged
from gateway.routing.static import FixedPolicy
from gateway.routing.types import Route


def pair(name: str, port: int = 9000, *, spec: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": name,
        "device": name,
        "base": {
            "name": f"{name}-base",
            "url": f"http://127.0.0.1:{port + 1}",
            "served_model_name": "m-base",
        },
    }
    if spec:
        out["spec"] = {
            "name": f"{name}-spec",
            "url": f"http://127.0.0.1:{port}",
            "served_model_name": "m-spec",
            "method": "ngram",
            "k": 4,
        }
    return out


def pc(name: str, port: int = 9000, *, spec: bool = True) -> PairConfig:
    return PairConfig.model_validate(pair(name, port, spec=spec))


class Hooks:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.closed = asyncio.Event()

    def start(self, model: ModelRuntime, p: PairRuntime, *, joined: bool) -> None:
        self.calls.append(("start", p.name))

    async def stop(self, p: PairRuntime) -> None:
        self.calls.append(("stop", p.name))

    async def close(self, p: PairRuntime) -> None:
        self.calls.append(("close", p.name))
        self.closed.set()


def fleet(*pairs: dict[str, Any], **cfg: Any) -> tuple[FleetRegistry, ModelRuntime, Hooks]:
    config = GatewayConfig.model_validate({"models": [{"name": "m", "pairs": list(pairs)}]})
    mrt = ModelRuntime.from_config(config.models[0], FixedPolicy(Route.BASE))
    hooks = Hooks()
    reg = FleetRegistry({"m": mrt}, FleetConfig(drain_poll_s=0.001, **cfg), hooks)
    return reg, mrt, hooks


def names(mrt: ModelRuntime) -> list[tuple[str, bool]]:
    return [(p.name, p.leaving) for p in mrt.pairs]


async def test_an_unchanged_declaration_changes_nothing() -> None:
    reg, mrt, hooks = fleet(pair("a"))
    assert not reg.declare("m", CONFIG, {"a": pc("a")})
    assert names(mrt) == [("a", False)] and hooks.calls == []


async def test_a_changed_pair_drains_and_its_successor_waits_for_the_names() -> None:
    reg, mrt, hooks = fleet(pair("a"))
    old = mrt.pairs[0]
    assert old.spec is not None
    old.spec.inflight = 1  # a request in flight on the old version
    seen: list[PairsChanged] = []
    reg.listeners.append(seen.append)
    change = reg.declare("m", CONFIG, {"a": pc("a", port=9100)})  # same names, new address
    assert change.names == {"added": [], "leaving": ["a"], "gone": []}
    assert reg.state("m")["pending"] == {"a": "waits for pair a's previous version to drain"}
    assert names(mrt) == [("a", True)] and old.spec.draining and old.base.draining
    assert mrt.view(0.0).pairs == ()
    old.spec.inflight = 0
    await reg.wait_gone("m", "a")  # the drain joined the pending pair before it let go
    assert names(mrt) == [("a", False)] and mrt.pairs[0] is not old
    assert mrt.pairs[0].base.config.url == "http://127.0.0.1:9101"
    assert [c.names for c in seen][1:] == [
        {"added": [], "leaving": [], "gone": ["a"]},
        {"added": ["a"], "leaving": [], "gone": []},
    ]
    # stopped, the successor started (the names are free), then the old sessions closed
    assert hooks.calls == [("stop", "a"), ("start", "a"), ("close", "a")]


async def test_a_pair_of_the_other_kind_is_refused_and_said_so() -> None:
    reg, _, _ = fleet(pair("a"))
    change = reg.declare("m", "dns", {"p": pc("p", 9200, spec=False)})
    assert not change
    assert reg.state("m")["refused"] == {"p": "the model's pairs have a spec engine"}


async def test_engine_names_taken_by_another_pair_are_refused() -> None:
    reg, _, _ = fleet(pair("a"))
    clash = PairConfig.model_validate({**pair("x", 9300), "base": {**pair("a")["base"]}})
    reg.declare("m", "dns", {"x": clash})
    assert "engine name a-base is taken by pair a" in str(reg.state("m")["refused"])


async def test_the_config_file_wins_a_name_clash_with_discovery() -> None:
    reg, mrt, _ = fleet(pair("a"))
    reg.declare("m", "dns", {"a": pc("a", 9400), "d": pc("d", 9500)})
    assert names(mrt) == [("a", False), ("d", False)]
    assert mrt.pairs[0].base.config.url == "http://127.0.0.1:9001" and mrt.pairs[1].source == "dns"


async def test_after_the_drain_timeout_the_pair_is_gone_but_its_sessions_wait_for_its_requests() -> None:
    reg, mrt, hooks = fleet(pair("a"), pair("b", 9600), drain_timeout_s=0.01)
    a = mrt.pairs[0]
    a.base.inflight = 1
    reg.declare("m", CONFIG, {"b": pc("b", 9600)})
    await reg.wait_gone("m", "a")
    assert names(mrt) == [("b", False)]
    assert hooks.calls == [("stop", "a")]  # scrapers stopped; sessions kept for the request
    a.base.inflight = 0
    await asyncio.wait_for(hooks.closed.wait(), 5.0)
    assert hooks.calls == [("stop", "a"), ("close", "a")]


async def test_a_model_with_discovery_may_start_without_pairs() -> None:
    disc = {"kind": "dns", "host": "pairs.example", "base": {"port": 8002, "served_model_name": "m-base"}}
    config = GatewayConfig.model_validate({"models": [{"name": "m", "discovery": disc}]})
    assert config.models[0].pairs == []
    with pytest.raises(ValueError, match="at least 1 pair"):
        GatewayConfig.model_validate({"models": [{"name": "m"}]})
