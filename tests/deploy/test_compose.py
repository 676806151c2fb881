"""deploy/compose: the compose file validates against the Compose Specification schema
(no Docker engine needed), and both profiles wire up what they claim: two vLLM engines
on one GPU (or the emulated pair), the gateway with a config that loads and addresses
them, Prometheus scraping all of them, Grafana provisioned with the dashboard."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import pytest
import yaml

from gateway.config import GatewayConfig, load_config
from gateway.routing.factory import build_policy
from tests.deploy.helpers import COMPOSE_DIR, DEPLOY, REPO, emulator_engines, flag, interpolate

COMPOSE_FILE = COMPOSE_DIR / "compose.yaml"
SCHEMA = Path(__file__).with_name("schemas") / "compose-spec.json"
PROFILES = ("gpu", "emulated")


@cache
def _raw() -> dict[str, Any]:
    with COMPOSE_FILE.open(encoding="utf-8") as f:
        data = yaml.safe_load(f)  # resolves the YAML merge keys (<<: *vllm-engine), as compose does
    assert isinstance(data, dict)
    return data


def compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    return copy.deepcopy(interpolate(_raw(), env or {}))


def services(profile: str) -> dict[str, Any]:
    """The services `docker compose --profile <profile> up` starts."""
    return {
        name: svc
        for name, svc in compose()["services"].items()
        if not svc.get("profiles") or profile in svc["profiles"]
    }


def bind_mounts(svc: dict[str, Any]) -> dict[str, Path]:
    """Container path → host path (resolved against the compose directory) of bind mounts."""
    out = {}
    for v in svc.get("volumes", []):
        src, dst = v.split(":")[:2]
        if src.startswith((".", "/")):
            out[dst] = (COMPOSE_DIR / src).resolve()
    return out


def gateway_config() -> GatewayConfig:
    gw = compose()["services"]["gateway"]
    path = bind_mounts(gw)[gw["command"][gw["command"].index("--config") + 1]]
    env = {k: str(v) for k, v in gw.get("environment", {}).items() if k.startswith("SPECGATE_")}
    return load_config(path, env=env)


# ---- schema -------------------------------------------------------------------------------


def validator() -> jsonschema.Draft201909Validator:
    # The file's $schema names draft 2019-09 by an old URL jsonschema does not know.
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    jsonschema.Draft201909Validator.check_schema(schema)
    return jsonschema.Draft201909Validator(schema)


def test_compose_file_validates_against_compose_spec() -> None:
    errors = sorted(validator().iter_errors(compose()), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_schema_check_is_not_vacuous() -> None:
    bad = compose()
    bad["services"]["gateway"]["helthcheck"] = {}
    assert list(validator().iter_errors(bad))
    bad = compose()
    bad["services"]["vllm-spec"]["depends_on"]["vllm-base"]["condition"] = "service_up"
    assert list(validator().iter_errors(bad))


def test_interpolation_defaults_and_overrides() -> None:
    assert compose()["services"]["vllm-base"]["command"][0] == "Qwen/Qwen3-8B"
    assert compose({"MODEL": "org/other"})["services"]["vllm-spec"]["command"][0] == "org/other"
    devices = compose({"GPU_DEVICE": "3"})["services"]["vllm-spec"]["deploy"]["resources"]["reservations"]
    assert devices["devices"][0]["device_ids"] == ["3"]


def test_references_resolve() -> None:
    all_services = compose()["services"]
    volumes = set(compose().get("volumes", {}))
    for name, svc in all_services.items():
        deps = svc.get("depends_on", [])
        for dep in deps if isinstance(deps, list) else deps.keys():
            assert dep in all_services, f"{name} depends on unknown {dep}"
            # A dependency must be started whenever the dependent is.
            assert set(all_services[dep].get("profiles", [])) <= set(
                svc.get("profiles", [])
            ) or not all_services[dep].get("profiles")
        for v in svc.get("volumes", []):
            src = v.split(":")[0]
            if src.startswith((".", "/")):
                assert (COMPOSE_DIR / src).exists(), f"{name}: bind mount source {src} does not exist"
            else:
                assert src in volumes, f"{name}: named volume {src} is not declared"
        if "build" in svc:
            ctx = (COMPOSE_DIR / svc["build"]["context"]).resolve()
            assert (ctx / svc["build"].get("dockerfile", "Dockerfile")).is_file()
        for port in svc.get("ports", []):
            assert re.fullmatch(r"\d+:\d+", str(port)), port
        image = svc["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: pin the image tag"


# ---- the engines ---------------------------------------------------------------------------


def test_gpu_profile_runs_two_vllm_engines_on_one_gpu() -> None:
    svcs = services("gpu")
    engines = {n: s for n, s in svcs.items() if s["image"].startswith("vllm/vllm-openai:")}
    assert set(engines) == {"vllm-spec", "vllm-base"}
    devices = []
    spec_configs = []
    for name, svc in engines.items():
        assert svc["profiles"] == ["gpu"]
        assert svc["entrypoint"] == ["vllm", "serve"]
        cmd = svc["command"]
        assert flag(cmd, "--gpu-memory-utilization") == "0.45"
        assert "--disable-log-stats" not in cmd
        if (sc := flag(cmd, "--speculative-config")) is not None:
            spec_configs.append((name, json.loads(sc)))
        reservation = svc["deploy"]["resources"]["reservations"]["devices"]
        assert len(reservation) == 1 and reservation[0]["capabilities"] == ["gpu"]
        assert reservation[0]["driver"] == "nvidia"
        devices.append(reservation[0]["device_ids"])
        port = flag(cmd, "--port")
        assert f"127.0.0.1:{port}/health" in svc["healthcheck"]["test"][-1]
    assert devices[0] == devices[1] and len(devices[0]) == 1, "both engines on the same single GPU"
    assert len(spec_configs) == 1 and spec_configs[0][0] == "vllm-spec"
    assert spec_configs[0][1]["method"] == "ngram"
    # Staggered start: the speculative engine waits for the plain one to be healthy.
    assert engines["vllm-spec"]["depends_on"] == {"vllm-base": {"condition": "service_healthy"}}
    assert "start_period" in engines["vllm-base"]["healthcheck"]


def test_emulated_profile_needs_no_gpu() -> None:
    svcs = services("emulated")
    assert not any(s["image"].startswith("vllm/") for s in svcs.values())
    assert not any("deploy" in s for s in svcs.values())
    emu = svcs["emulator"]
    engines = emulator_engines(emu["command"])
    assert len(engines) == 2 and len({device for _, _, device, _ in engines.values()}) == 1
    assert sorted(spec is None for _, spec, _, _ in engines.values()) == [False, True]
    assert all(stats for *_, stats in engines.values()), "vllm:* metrics must stay on"
    # The image's HEALTHCHECK probes SPECGATE_HEALTH_PORT: one of the emulator's ports.
    assert int(emu["environment"]["SPECGATE_HEALTH_PORT"]) in engines


def engine_endpoints(profile: str) -> dict[str, dict[str, Any]]:
    """host name → what answers there: ports and served names per port, speculative config."""
    out: dict[str, dict[str, Any]] = {}
    for name, svc in services(profile).items():
        cmd = svc.get("command", [])
        if svc["image"].startswith("vllm/vllm-openai:"):
            entry = {
                int(flag(cmd, "--port") or 0): (
                    flag(cmd, "--served-model-name"),
                    flag(cmd, "--speculative-config"),
                )
            }
            hosts = [name]
        elif cmd[:1] == ["emulate"]:
            entry = {
                port: (served, json.dumps(spec) if spec is not None else None)
                for port, (served, spec, _device, _stats) in emulator_engines(cmd).items()
            }
            hosts = [name, *svc.get("networks", {}).get("default", {}).get("aliases", [])]
        else:
            continue
        for h in hosts:
            assert h not in out, f"two services answer as {h} in profile {profile}"
            out[h] = entry
    return out


@pytest.mark.parametrize("profile", PROFILES)
def test_gateway_config_loads_and_addresses_the_profiles_engines(profile: str) -> None:
    cfg = gateway_config()
    assert cfg.server.host == "0.0.0.0"
    gw = services(profile)["gateway"]
    assert f":{cfg.server.port}" in gw["ports"][0]
    endpoints = engine_endpoints(profile)
    for model in cfg.models:
        build_policy(model.routing)
        for pair in model.pairs:
            for role, engine in (("spec", pair.spec), ("base", pair.base)):
                url = urlsplit(engine.url)
                assert url.hostname in endpoints, f"{engine.url}: no service answers in profile {profile}"
                served = endpoints[url.hostname].get(url.port)
                assert served is not None, f"{engine.url}: nothing listens on that port"
                served_name, spec_json = served
                assert served_name == engine.served_model_name
                if role == "base":
                    assert spec_json is None
                else:
                    assert spec_json is not None
                    sc = json.loads(spec_json)
                    assert (sc["method"], sc["num_speculative_tokens"]) == (engine.method, engine.k)
                    assert sc.get("prompt_lookup_min") == engine.prompt_lookup_min
                    assert sc.get("prompt_lookup_max") == engine.prompt_lookup_max


def test_gateway_container_is_hardened() -> None:
    gw = compose()["services"]["gateway"]
    assert gw["read_only"] is True and gw["cap_drop"] == ["ALL"]
    assert gw["user"].split(":")[0] not in ("0", "root")
    assert "no-new-privileges:true" in gw["security_opt"]
    assert gw["volumes"][0].endswith(":/etc/specgate/config.yaml:ro")


# ---- Prometheus and Grafana ------------------------------------------------------------------


def prometheus_config() -> tuple[dict[str, Any], Path]:
    prom = compose()["services"]["prometheus"]
    config_in_container = flag(prom["command"], "--config.file")
    assert config_in_container is not None
    path = bind_mounts(prom)[config_in_container]
    with path.open(encoding="utf-8") as f:
        return yaml.safe_load(f), path


def _targets(cfg: dict[str, Any]) -> dict[str, list[tuple[str, dict[str, str]]]]:
    return {
        job["job_name"]: [(t, sc.get("labels", {})) for sc in job["static_configs"] for t in sc["targets"]]
        for job in cfg["scrape_configs"]
    }


@pytest.mark.parametrize("profile", PROFILES)
def test_prometheus_scrapes_gateway_and_both_engines(profile: str) -> None:
    cfg, _ = prometheus_config()
    gw_cfg = gateway_config()
    targets = _targets(cfg)
    endpoints = engine_endpoints(profile)
    assert targets["specgate"] == [(f"gateway:{gw_cfg.server.port}", {})]
    engines = {
        e.name: (e, role)
        for m in gw_cfg.models
        for p in m.pairs
        for role, e in (("spec", p.spec), ("base", p.base))
    }
    seen = set()
    for target, labels in targets["vllm"]:
        engine, role = engines[labels["engine_name"]]
        assert target == urlsplit(engine.url).netloc
        assert labels["route"] == role
        assert labels["model"] in {m.name for m in gw_cfg.models}
        host, port = target.split(":")
        assert int(port) in endpoints[host]
        seen.add(labels["engine_name"])
    assert seen == set(engines)


def test_prometheus_config_keeps_observability_conventions() -> None:
    """Same jobs and target-label keys as deploy/prometheus (the dashboard and alerts use them)."""
    ours, _ = prometheus_config()
    with (DEPLOY / "prometheus" / "prometheus.yml").open(encoding="utf-8") as f:
        reference = yaml.safe_load(f)
    ref_targets, our_targets = _targets(reference), _targets(ours)
    assert set(our_targets) == set(ref_targets)
    for job, items in ref_targets.items():
        assert {tuple(sorted(lbl)) for _, lbl in our_targets[job]} == {tuple(sorted(lbl)) for _, lbl in items}
    assert ours["global"]["scrape_interval"] == reference["global"]["scrape_interval"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_promtool_accepts_the_mounted_layout() -> None:
    """Rebuild the container's /etc/prometheus from the bind mounts; promtool checks it (and the rules)."""
    prom = compose()["services"]["prometheus"]
    mounts = bind_mounts(prom)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for dst, src in mounts.items():
            assert dst.startswith("/etc/prometheus/")
            target = root / dst.removeprefix("/etc/prometheus/")
            if src.is_dir():
                shutil.copytree(src, target)
            else:
                shutil.copy(src, target)
        config = root / "prometheus.yml"
        proc = subprocess.run(
            ["promtool", "check", "config", str(config)], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "SUCCESS" in proc.stdout and "rule" in proc.stdout.lower()


def test_grafana_is_provisioned_with_the_dashboard() -> None:
    graf = compose()["services"]["grafana"]
    mounts = bind_mounts(graf)
    prov = mounts["/etc/grafana/provisioning"]
    assert prov == (DEPLOY / "grafana" / "provisioning").resolve()
    with (prov / "dashboards" / "specgate.yml").open(encoding="utf-8") as f:
        provider = yaml.safe_load(f)["providers"][0]
    dash_dir = mounts[provider["options"]["path"]]
    assert list(dash_dir.glob("*.json")), "the provider's folder holds the dashboard JSON"
    for dash in dash_dir.glob("*.json"):
        json.loads(dash.read_text(encoding="utf-8"))
    with (prov / "datasources" / "prometheus.yml").open(encoding="utf-8") as f:
        ds = yaml.safe_load(f)["datasources"][0]
    url = interpolate(ds["url"], {k: str(v) for k, v in graf["environment"].items()})
    prom = compose()["services"]["prometheus"]
    assert url == "http://prometheus:" + prom["ports"][0].split(":")[-1]
    assert "prometheus" in (graf.get("depends_on") or [])


def test_readme_documents_both_profiles() -> None:
    text = (COMPOSE_DIR / "README.md").read_text(encoding="utf-8")
    for profile in PROFILES:
        assert f"--profile {profile}" in text
    assert "deploy/compose" in (REPO / "README.md").read_text(encoding="utf-8")
