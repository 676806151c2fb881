"""Config reload: what applies live and what waits for a restart; POST /admin/reload, the
file watch, SIGHUP to ``specgate serve``; a new configuration that is invalid is refused."""

from __future__ import annotations

import asyncio
import copy
import re
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from gateway.config import ConfigError, GatewayConfig, load_config
from gateway.fleet.reload import ConfigSource, Outcome, plan
from tests.fleet.helpers import MODEL, gateway
from tests.reliability.rig import until


def pair(name: str, port: int) -> dict[str, Any]:
    return {
        "name": name,
        "device": name,
        "spec": {
            "name": f"{name}-spec",
            "url": f"http://127.0.0.1:{port}",
            "served_model_name": "s",
            "method": "ngram",
            "k": 4,
        },
        "base": {"name": f"{name}-base", "url": f"http://127.0.0.1:{port + 1}", "served_model_name": "b"},
    }


def data(*pairs: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {
        "server": {"port": 0},
        "scrape": {"enabled": False},
        "fleet": {"drain_poll_s": 0.01},
        "models": [{"name": MODEL, "pairs": list(pairs)}],
        **top,
    }


def test_plan_applies_pairs_and_per_request_settings_and_lists_the_rest() -> None:
    old = GatewayConfig.model_validate(data(pair("a", 9000)))
    new_data = data(pair("b", 9100), server={"port": 9999, "api_keys": ["a-new-client-key"]})
    m = new_data["models"][0]
    m["timeouts"] = {"total_s": 30}
    m["routing"] = {"policy": "always-base"}
    new_data["models"].append({"name": "other", "pairs": [pair("c", 9200)]})
    p = plan(old, GatewayConfig.model_validate(new_data))
    assert set(p.applied) == {f"models[{MODEL}].pairs", f"models[{MODEL}].timeouts.total_s"}
    assert set(p.restart_needed) == {
        f"models[{MODEL}].routing.policy",
        "server.port",
        "server.api_keys",
        "models[other] (added)",
    }
    eff = p.effective
    assert [x.key for x in eff.models[0].pairs] == ["b"] and eff.models[0].timeouts.total_s == 30
    assert eff.models[0].routing.policy == old.models[0].routing.policy
    assert eff.server == old.server and [x.name for x in eff.models] == [MODEL]
    assert "a-new-client-key" not in repr(p)


def test_plan_refuses_a_mix_that_breaks_a_cross_section_rule() -> None:
    keyed = pair("a", 9000)
    keyed["base"]["api_key"] = "engine-key-1"
    old = GatewayConfig.model_validate(data(pair("a", 9000), epp={"enabled": True}))
    new = GatewayConfig.model_validate(data(keyed))  # the new file has no EPP: valid alone
    with pytest.raises(ConfigError, match="auth_token"):
        plan(old, new)  # but the EPP keeps serving until a restart, and would hand the key out


async def test_post_admin_reload_applies_pairs_and_refuses_an_invalid_file(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(data(pair("a", 9000))))
    source = ConfigSource(lambda: load_config(path, env={}), path)
    async with gateway(load_config(path, env={}), config_source=source) as (server, st):
        url = str(server.make_url("/admin/reload"))
        path.write_text(yaml.safe_dump(data(pair("b", 9100), server={"port": 1234})))
        async with aiohttp.ClientSession() as http:
            async with http.post(url) as r:
                assert r.status == 200
                out = await r.json()
            assert out["ok"] and out["applied"] == [f"models[{MODEL}].pairs"]
            assert out["restart_needed"] == ["server.port"]
            assert st.fleet is not None
            await st.fleet.wait_gone(MODEL, "a")
            assert [p.name for p in st.models[MODEL].pairs] == ["b"]
            assert [p.key for p in st.config.models[0].pairs] == ["b"] and st.config.server.port == 0

            path.write_text("models: [\n")  # broken YAML
            async with http.post(url) as r:
                assert r.status == 422
                out = await r.json()
            assert not out["ok"] and "invalid YAML" in out["error"]
            path.write_text(yaml.safe_dump(data()))  # a model without pairs: invalid
            async with http.post(url) as r:
                assert r.status == 422
                assert "at least 1 pair" in (await r.json())["error"]
            assert [p.name for p in st.models[MODEL].pairs] == ["b"]  # the old one keeps serving
            async with http.get(str(server.make_url("/admin/state"))) as r:
                state = (await r.json())["config"]
            assert state["reloadable"] and not state["last_reload"]["ok"]
            assert state["restart_needed"] == ["server.port"]  # still pending since the good reload


async def test_reload_needs_a_source_and_an_admin(tmp_path: Path) -> None:
    config = GatewayConfig.model_validate(data(pair("a", 9000)))
    async with (
        gateway(config) as (server, _),
        aiohttp.ClientSession() as http,
        http.post(str(server.make_url("/admin/reload"))) as r,
    ):
        assert r.status == 409
    keyed = GatewayConfig.model_validate(
        data(pair("a", 9000), server={"port": 0, "admin_keys": ["admin-key-01"]})
    )
    source = ConfigSource(lambda: keyed)
    async with gateway(keyed, config_source=source) as (server, _), aiohttp.ClientSession() as http:
        async with http.post(str(server.make_url("/admin/reload"))) as r:
            assert r.status == 401
        auth = {"Authorization": "Bearer admin-key-01"}
        async with http.post(str(server.make_url("/admin/reload")), headers=auth) as r:
            assert r.status == 200 and (await r.json())["applied"] == []


async def test_the_file_watch_reloads_changed_bytes_only(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    first = data(pair("a", 9000), fleet={"drain_poll_s": 0.01, "watch_config_s": 0.01})
    path.write_text(yaml.safe_dump(first))
    source = ConfigSource(lambda: load_config(path, env={}), path)
    async with gateway(load_config(path, env={}), config_source=source) as (_, st):
        assert st.reloader is not None and st.reloader.watching
        outcomes: asyncio.Queue[Outcome] = asyncio.Queue()
        st.reloader.listeners.append(outcomes.put_nowait)
        second = copy.deepcopy(first)
        second["models"][0]["pairs"].append(pair("b", 9100))
        path.write_text(yaml.safe_dump(second))
        got = await asyncio.wait_for(outcomes.get(), 10)
        assert got.trigger == "file watch" and got.ok and got.applied == (f"models[{MODEL}].pairs",)
        assert [p.name for p in st.models[MODEL].pairs] == ["a", "b"]
    # the same bytes written again (a new mtime) are not a change
    source2 = ConfigSource(source.load, path)
    from gateway.fleet.reload import Reloader

    r = Reloader(source2, lambda: load_config(path, env={}), lambda _: None)
    assert not await r.check_file()  # the first look: the state it starts from
    path.write_text(yaml.safe_dump(second))
    assert not await r.check_file()
    path.write_text(yaml.safe_dump(first))
    assert await r.check_file()


async def test_sighup_reloads_specgate_serve(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(data(pair("a", 9000))))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--config",
        str(path),
        "--log-level",
        "INFO",
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        url = ""
        while not url:
            line = await asyncio.wait_for(proc.stderr.readline(), 30)
            assert line, "serve exited"
            m = re.search(rb"listening on (http://\S+)", line)
            url = m.group(1).decode() if m else ""
        path.write_text(yaml.safe_dump(data(pair("a", 9000), pair("b", 9100), server={"port": 1})))
        proc.send_signal(signal.SIGHUP)
        logged = []
        while not any(b"restart" in x for x in logged):
            logged.append(await asyncio.wait_for(proc.stderr.readline(), 30))
        assert any(b"config reload (SIGHUP): 1 change(s) applied" in x for x in logged), logged
        assert any(b"only after a restart: server.port" in x for x in logged), logged

        async def pairs() -> list[str]:
            async with aiohttp.ClientSession() as s, s.get(url + "/admin/state") as r:
                return [p["name"] for p in (await r.json())["models"][MODEL]["pairs"]]

        await until(lambda: pairs(), what="state answered")
        assert await pairs() == ["a", "b"]
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
