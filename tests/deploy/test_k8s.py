"""deploy/k8s: every manifest validates against the Kubernetes schemas, every kustomization
builds, and what is built is consistent: the gateway config that ships loads, and it
addresses exactly the engine pairs the overlay runs."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import tempfile
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gateway.config import GatewayConfig, load_config
from gateway.routing.factory import build_policy
from tests.deploy import kustomize
from tests.deploy.crds import PROMETHEUSRULE_SCHEMA
from tests.deploy.helpers import K8S, REPO, emulator_engines, find, one
from tests.deploy.test_epp_manifests import EPP_CRD_SCHEMAS

K8S_VERSION = kubernetes_validate.latest_version()
KUSTOMIZATIONS = sorted(p.parent for p in K8S.rglob("kustomization.yaml"))
OVERLAYS = sorted(p.parent for p in (K8S / "overlays").glob("*/kustomization.yaml"))
# Overlays that run engine pairs (all of them) and whether the pairs hold GPUs.
PAIR_OVERLAYS = {"gpu": True, "emulated": False, "gpu-prometheus-operator": True}

Doc = dict[str, Any]


@cache
def rendered(directory: Path) -> tuple[Doc, ...]:
    return tuple(kustomize.render(directory))


def docs(directory: Path) -> list[Doc]:
    return copy.deepcopy(list(rendered(directory)))


def rel(p: Path) -> str:
    return p.relative_to(REPO).as_posix()


# ---- schema validation -------------------------------------------------------------------

# The Prometheus Operator's CRDs are not in kubernetes-validate's bundle: the fields this
# project uses, from monitoring.coreos.com/v1 ServiceMonitor, checked strictly.
_RELABEL = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "sourceLabels": {"type": "array", "items": {"type": "string"}},
        "separator": {"type": "string"},
        "regex": {"type": "string"},
        "replacement": {"type": "string"},
        "targetLabel": {"type": "string"},
        "action": {"enum": ["replace", "keep", "drop", "labelmap", "labeldrop", "labelkeep", "hashmod"]},
    },
}
SERVICEMONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
                "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "jobLabel": {"type": "string"},
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}
                    },
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["port"],
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "scrapeTimeout": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "relabelings": {"type": "array", "items": _RELABEL},
                        },
                    },
                },
            },
        },
    },
}
# The InferencePool and HTTPRoute of components/epp: the fields of their CRDs, strictly.
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICEMONITOR_SCHEMA,
    ("monitoring.coreos.com/v1", "PrometheusRule"): PROMETHEUSRULE_SCHEMA,
    **EPP_CRD_SCHEMAS,
}


def validate(obj: Doc) -> None:
    crd = CRD_SCHEMAS.get((obj["apiVersion"], obj["kind"]))
    if crd is not None:
        jsonschema.validate(obj, crd)
        return
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def manifest_files() -> list[Path]:
    """Every resource file of every kustomization (generator inputs are not manifests)."""
    files: set[Path] = set()
    generated: set[Path] = set()
    for d in KUSTOMIZATIONS:
        files |= kustomize.referenced_files(d)
    for kfile in (f for f in files if f.name in kustomize.KUSTOMIZATION_NAMES):  # deploy/grafana's too
        for gen in kustomize._load(kfile).get("configMapGenerator", []):
            generated |= set(kustomize._generator_files(gen, kfile.parent).values())
    return sorted(f for f in files - generated if f.name != "kustomization.yaml")


@pytest.mark.parametrize("path", manifest_files(), ids=rel)
def test_every_manifest_file_validates(path: Path) -> None:
    for obj in kustomize._docs(path):
        validate(obj)


def test_no_orphan_files_under_k8s() -> None:
    """Every file under deploy/k8s is used by some kustomization (or is documentation or a tool)."""
    used: set[Path] = set()
    for d in KUSTOMIZATIONS:
        used |= kustomize.referenced_files(d)
    for path in K8S.rglob("*"):
        skip = path.suffix == ".md" or "__pycache__" in path.parts or (K8S / "tools") in path.parents
        if path.is_file() and not skip:
            assert path.resolve() in used, f"{rel(path)} is not referenced by any kustomization"


def test_validator_is_not_vacuous() -> None:
    """The strict validation used above rejects a misspelt field and a wrong type."""
    dep = one(docs(K8S / "base"), "Deployment", "specgate")
    bad = copy.deepcopy(dep)
    bad["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(bad)
    bad = copy.deepcopy(dep)
    bad["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(bad)


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=rel)
def test_kustomization_builds_and_validates(directory: Path) -> None:
    if kustomize._load(kustomize.kustomization_file(directory)).get("kind") == "Component":
        pytest.skip("a Component builds only as part of an overlay")
    built = docs(directory)
    assert built
    for obj in built:
        validate(obj)


def _identity(obj: Doc, hashed: bool = False) -> tuple[str, str, str]:
    name = obj["metadata"]["name"]
    if hashed and obj["kind"] == "ConfigMap":
        name = re.sub(r"-[a-z0-9]{10}$", "", name)  # kustomize's content-hash suffix
    return obj["kind"], name, obj["metadata"].get("namespace", "")


@pytest.mark.skipif(kustomize.kustomize_command() is None, reason="no kustomize or kubectl installed")
@pytest.mark.parametrize("directory", OVERLAYS, ids=rel)
def test_python_renderer_matches_kustomize(directory: Path) -> None:
    """The offline renderer (used where no kustomize binary exists) builds the same objects."""
    real = sorted(_identity(o, hashed=True) for o in kustomize.build_with_binary(directory))
    ours = sorted(_identity(o) for o in kustomize.build_in_python(directory))
    assert ours == real


def test_overlays_cover_the_expected_set() -> None:
    assert {d.name for d in OVERLAYS} == set(PAIR_OVERLAYS)


# ---- the gateway ---------------------------------------------------------------------------


def gateway_config(objs: list[Doc]) -> tuple[GatewayConfig, Doc]:
    dep = one(objs, "Deployment", "specgate")
    pod = dep["spec"]["template"]["spec"]
    container = pod["containers"][0]
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/etc/specgate")
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    cm = one(objs, "ConfigMap", volume["configMap"]["name"])
    args = container["args"]
    path = Path(args[args.index("--config") + 1])
    assert path.parent == Path("/etc/specgate")
    text = cm["data"][path.name]
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / path.name
        file.write_text(text, encoding="utf-8")
        cfg = load_config(file, env={k: v for k, v in env.items() if k.startswith("SPECGATE_")})
    return cfg, dep


@pytest.mark.parametrize("overlay", sorted(PAIR_OVERLAYS))
def test_gateway_config_in_configmap_loads(overlay: str) -> None:
    cfg, _ = gateway_config(docs(K8S / "overlays" / overlay))
    assert cfg.server.host == "0.0.0.0" and cfg.server.port == 8000
    for m in cfg.models:
        build_policy(m.routing)


def test_gateway_deployment_is_production_shaped() -> None:
    objs = docs(K8S / "overlays" / "gpu")
    cfg, dep = gateway_config(objs)
    spec = dep["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    (c,) = pod["containers"]
    assert spec["replicas"] >= 2
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    port_names = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert port_names["http"] == cfg.server.port
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["httpGet"]["port"] in ("http", cfg.server.port)
    res = c["resources"]
    assert {"cpu", "memory"} <= set(res["requests"]) and "memory" in res["limits"]
    psc, csc = pod["securityContext"], c["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0
    assert psc["seccompProfile"]["type"] == "RuntimeDefault"
    assert csc["readOnlyRootFilesystem"] is True and csc["allowPrivilegeEscalation"] is False
    assert csc["capabilities"]["drop"] == ["ALL"]
    # A writable /tmp is the only writable path.
    assert any(m["mountPath"] == "/tmp" for m in c["volumeMounts"])
    # Draining outlives the configured shutdown grace.
    assert pod["terminationGracePeriodSeconds"] > cfg.server.shutdown_grace_s
    assert c["image"].startswith("specgate:")

    svc = one(objs, "Service", "specgate")
    assert svc["spec"]["selector"].items() <= labels.items()
    assert svc["spec"]["ports"][0]["targetPort"] in port_names

    pdb = one(objs, "PodDisruptionBudget", "specgate")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"].get("maxUnavailable", 0) == 1 or pdb["spec"].get("minAvailable", 0) >= 1

    hpa = one(objs, "HorizontalPodAutoscaler", "specgate")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "specgate",
    }
    assert hpa["spec"]["minReplicas"] >= 2 and hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]
    assert spec["replicas"] >= hpa["spec"]["minReplicas"]
    # HPA on CPU utilisation needs a CPU request.
    assert any(m["resource"]["name"] == "cpu" for m in hpa["spec"]["metrics"])


# ---- the engine pairs -------------------------------------------------------------------------


def _env(container: Doc) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def engine_view(sts: Doc) -> dict[str, Any]:
    """What a pair pod serves: per role, port and served name, plus the spec config."""
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    if (c.get("command") or [""])[-1].endswith("supervisor.py"):  # real vLLM under the supervisor
        env = _env(c)
        assert int(env["SPEC_PORT"]) == ports["spec"] and int(env["BASE_PORT"]) == ports["base"]
        extra = shlex.split(env.get("ENGINE_ARGS", "")) + shlex.split(env.get("SPEC_ARGS", ""))
        extra += shlex.split(env.get("BASE_ARGS", ""))
        return {
            "spec": (ports["spec"], env["SPEC_SERVED_MODEL_NAME"]),
            "base": (ports["base"], env["BASE_SERVED_MODEL_NAME"]),
            "spec_config": json.loads(env["SPEC_CONFIG"]),
            "gpu_share": float(env["GPU_MEMORY_UTILIZATION"]),
            "extra": extra,
        }
    engines = emulator_engines(c["args"])  # the emulator: `specgate emulate --pair ...`
    assert set(engines) == set(ports.values())
    (spec_port,) = [p for p, e in engines.items() if e[1] is not None]
    (base_port,) = [p for p, e in engines.items() if e[1] is None]
    assert (spec_port, base_port) == (ports["spec"], ports["base"])
    assert len({e[2] for e in engines.values()}) == 1, "both engines on one device timeline"
    assert all(e[3] for e in engines.values()), "vllm:* metrics must stay on"
    return {
        "spec": (spec_port, engines[spec_port][0]),
        "base": (base_port, engines[base_port][0]),
        "spec_config": engines[spec_port][1],
        "gpu_share": None,
        "extra": c["args"],
    }


@pytest.mark.parametrize("overlay", sorted(PAIR_OVERLAYS))
def test_gateway_config_addresses_exactly_the_pairs_that_run(overlay: str) -> None:
    objs = docs(K8S / "overlays" / overlay)
    cfg, _ = gateway_config(objs)
    statefulsets = {s["metadata"]["name"]: s for s in find(objs, "StatefulSet")}
    assert statefulsets, "no engine pairs"
    addressed: dict[str, set[int]] = {name: set() for name in statefulsets}
    for model in cfg.models:
        for pair in model.pairs:
            hosts = set()
            for role, engine in (("spec", pair.spec), ("base", pair.base)):
                url = urlsplit(engine.url)
                assert url.hostname is not None and url.port is not None
                m = re.fullmatch(r"(?P<sts>[a-z0-9-]+)-(?P<idx>\d+)\.(?P<svc>[a-z0-9-]+)", url.hostname)
                assert m, f"{engine.url}: address pods as <statefulset>-<N>.<headless service>"
                sts = statefulsets[m["sts"]]
                assert sts["spec"]["serviceName"] == m["svc"]
                svc = one(objs, "Service", m["svc"])
                assert svc["spec"]["clusterIP"] == "None", "per-pod DNS needs a headless Service"
                assert (
                    svc["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
                )
                assert url.port in {p["port"] for p in svc["spec"]["ports"]}
                idx = int(m["idx"])
                assert idx < sts["spec"]["replicas"], f"{engine.url}: pod {idx} does not exist"
                view = engine_view(sts)
                assert view[role] == (url.port, engine.served_model_name), (role, engine.url)
                hosts.add(url.hostname)
                addressed[m["sts"]].add(idx)
            # Both engines of a configured pair are one pod: one GPU, one device timeline.
            assert len(hosts) == 1, f"pair {pair.device} spans pods {hosts}"
            spec_cfg = engine_view(statefulsets[next(iter(hosts)).split(".")[1]])["spec_config"]
            assert spec_cfg["method"] == pair.spec.method
            assert spec_cfg["num_speculative_tokens"] == pair.spec.k
            if pair.spec.method in ("ngram", "ngram_gpu"):
                assert spec_cfg.get("prompt_lookup_min") == pair.spec.prompt_lookup_min
                assert spec_cfg.get("prompt_lookup_max") == pair.spec.prompt_lookup_max
    for name, sts in statefulsets.items():
        # No idle GPUs: every replica is a pair the gateway routes to.
        assert addressed[name] == set(range(sts["spec"]["replicas"])), name


@pytest.mark.parametrize("overlay", sorted(PAIR_OVERLAYS))
def test_each_pair_shares_one_device(overlay: str) -> None:
    objs = docs(K8S / "overlays" / overlay)
    for sts in find(objs, "StatefulSet"):
        pod = sts["spec"]["template"]["spec"]
        gpus = [
            c["resources"].get("limits", {}).get("nvidia.com/gpu")
            for c in pod["containers"]
            if "nvidia.com/gpu" in c.get("resources", {}).get("limits", {})
        ]
        view = engine_view(sts)
        assert sts["spec"]["podManagementPolicy"] == "Parallel"
        if PAIR_OVERLAYS[overlay]:
            # ONE container holds ONE GPU and runs both engines (see the StatefulSet's comment).
            assert gpus == ["1"]
            assert len(pod["containers"]) == 1
            assert view["gpu_share"] is not None and 2 * view["gpu_share"] < 1.0
            assert view["gpu_share"] == pytest.approx(0.45)
            assert "--disable-log-stats" not in view["extra"]
            (c,) = pod["containers"]
            assert c["image"].startswith("vllm/vllm-openai:") and not c["image"].endswith(":latest")
            script = c["command"][-1]
            mount = next(m for m in c["volumeMounts"] if script.startswith(m["mountPath"] + "/"))
            volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
            cm = one(objs, "ConfigMap", volume["configMap"]["name"])
            supervisor = K8S / "engines" / "vllm-pair" / "supervisor.py"
            assert cm["data"][Path(script).name] == supervisor.read_text(encoding="utf-8")
            assert volume["configMap"]["defaultMode"] & 0o111
        else:
            assert gpus == []
            (c,) = pod["containers"]
            assert pod["securityContext"]["runAsNonRoot"] is True
            assert c["securityContext"]["readOnlyRootFilesystem"] is True


# ---- the optional ServiceMonitors -------------------------------------------------------------


def _relabel(rules: list[Doc], meta: dict[str, str]) -> dict[str, str]:
    """Apply Prometheus 'replace' relabelings (the default action) to target labels."""
    labels = dict(meta)
    for r in rules:
        src = r.get("separator", ";").join(labels.get(s, "") for s in r.get("sourceLabels", []))
        m = re.fullmatch(r.get("regex", "(.*)"), src)
        if m is None:
            continue
        value = m.expand(re.sub(r"\$\{?(\d+)\}?", r"\\g<\1>", r.get("replacement", "$1")))
        labels[r["targetLabel"]] = value
    return labels


def test_servicemonitors_scrape_gateway_and_label_engines_like_the_config() -> None:
    objs = docs(K8S / "overlays" / "gpu-prometheus-operator")
    cfg, _ = gateway_config(objs)
    monitors = find(objs, "ServiceMonitor")
    assert len(monitors) == 2
    for mon in monitors:
        assert mon["metadata"]["namespace"] == "specgate"
    gw = one(objs, "ServiceMonitor", "specgate")
    svc = one(objs, "Service", "specgate")
    assert gw["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert {e["port"] for e in gw["spec"]["endpoints"]} <= {p["name"] for p in svc["spec"]["ports"]}

    engines = one(objs, "ServiceMonitor", "specgate-engines")
    engine_names = {e.name for m in cfg.models for p in m.pairs for e in (p.spec, p.base)}
    for sts in find(objs, "StatefulSet"):
        headless = one(objs, "Service", sts["spec"]["serviceName"])
        assert engines["spec"]["selector"]["matchLabels"].items() <= headless["metadata"]["labels"].items()
        model = sts["spec"]["template"]["metadata"]["labels"]["specgate.io/model"]
        seen = set()
        for endpoint in engines["spec"]["endpoints"]:
            for idx in range(sts["spec"]["replicas"]):
                labels = _relabel(
                    endpoint["relabelings"],
                    {
                        "__meta_kubernetes_pod_name": f"{sts['metadata']['name']}-{idx}",
                        "__meta_kubernetes_endpoint_port_name": endpoint["port"],
                        "__meta_kubernetes_pod_label_specgate_io_model": model,
                    },
                )
                assert labels["job"] == "vllm" and labels["route"] == endpoint["port"]
                assert labels["model"] in {m.name for m in cfg.models}
                seen.add(labels["engine_name"])
        # The dashboard joins engine metrics to the gateway's by these names.
        assert seen == engine_names


def test_prometheus_operator_overlay_is_the_gpu_overlay_plus_monitoring() -> None:
    base = {_identity(o) for o in docs(K8S / "overlays" / "gpu")}
    plus = {_identity(o) for o in docs(K8S / "overlays" / "gpu-prometheus-operator")}
    assert plus - base == {
        ("ServiceMonitor", "specgate", "specgate"),
        ("ServiceMonitor", "specgate-engines", "specgate"),
        ("PrometheusRule", "specgate", "specgate"),
        ("ConfigMap", "specgate-dashboard", "specgate"),
    }
    assert base <= plus


def with_component(tmp_path: Path, overlay: str, component: str, namespace: str | None = None) -> list[Doc]:
    """An overlay with a component, built through a throw-away kustomization in
    ``tmp_path``; every object validated."""
    k: dict[str, Any] = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization"}
    if namespace is not None:
        k["namespace"] = namespace
    # kustomize refuses absolute paths
    k["resources"] = [os.path.relpath(K8S / "overlays" / overlay, tmp_path)]
    k["components"] = [os.path.relpath(K8S / "components" / component, tmp_path)]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(k), encoding="utf-8")
    objs = kustomize.render(tmp_path)
    for obj in objs:
        validate(obj)
    return objs


def test_engine_network_policy_component_admits_the_gateway_only(tmp_path: Path) -> None:
    """Built into the GPU overlay through a throw-away overlay: it selects every engine pod,
    admits the gateway pods on the engine ports, and nothing from arbitrary pods."""
    objs = with_component(tmp_path, "gpu", "engine-network-policy", namespace="specgate")
    (policy,) = find(objs, "NetworkPolicy")
    assert policy["metadata"]["namespace"] == "specgate"
    selector = policy["spec"]["podSelector"]["matchLabels"]
    gateway_labels = one(objs, "Deployment", "specgate")["spec"]["template"]["metadata"]["labels"]
    assert not selector.items() <= gateway_labels.items(), "the gateway itself stays reachable"
    for sts in find(objs, "StatefulSet"):
        pod_labels = sts["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= pod_labels.items()
        engine_ports = {p["name"] for c in sts["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
        rules = policy["spec"]["ingress"]
        assert all(r.get("from") for r in rules), "no rule may admit every source"
        gateway_rules = [
            r
            for r in rules
            if any(
                "podSelector" in f and f["podSelector"]["matchLabels"].items() <= gateway_labels.items()
                for f in r["from"]
            )
        ]
        assert gateway_rules
        assert {p["port"] for r in gateway_rules for p in r["ports"]} == engine_ports


def test_peers_component_joins_the_replicas_through_its_redis(tmp_path: Path) -> None:
    """Built into the emulated overlay: the gateway's SPECGATE_PEERS__URL comes from the
    component's ConfigMap and addresses the component's Redis Service; without the
    component the reference is optional and the replicas run without a channel."""
    objs = with_component(tmp_path, "emulated", "peers")
    container = one(objs, "Deployment", "specgate")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    ref = env["SPECGATE_PEERS__URL"]["valueFrom"]["configMapKeyRef"]
    assert ref["optional"] is True
    url = one(objs, "ConfigMap", ref["name"])["data"][ref["key"]]
    service = one(objs, "Service", "specgate-redis")
    port = service["spec"]["ports"][0]["port"]
    assert url == f"redis://{service['metadata']['name']}:{port}/0"
    redis = one(objs, "Deployment", "specgate-redis")
    assert service["spec"]["selector"].items() <= redis["spec"]["template"]["metadata"]["labels"].items()
    assert env["SPECGATE_PEERS__REPLICA_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    cfg = load_config(None, env={"SPECGATE_PEERS__URL": url, "SPECGATE_PEERS__REPLICA_ID": "specgate-0"})
    assert cfg.peers.url is not None and cfg.peers.url.get_secret_value() == url
    # the overlays themselves carry no channel: their replicas decide alone
    for overlay in PAIR_OVERLAYS:
        assert not find(docs(K8S / "overlays" / overlay), "ConfigMap", "specgate-peers")


def test_discovery_component_lets_the_gateway_watch_the_pairs_endpointslices(tmp_path: Path) -> None:
    """Built into the GPU overlay: the gateway's service account may get/list/watch
    EndpointSlices in its namespace (and nothing else), mounts its token, and its config
    (file + env) discovers the pairs of the engines' headless Service by its port names."""
    objs = with_component(tmp_path, "gpu", "discovery", namespace="specgate")
    role = one(objs, "Role", "specgate-discovery")
    assert role["rules"] == [
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    binding = one(objs, "RoleBinding", "specgate-discovery")
    assert binding["roleRef"]["name"] == "specgate-discovery"
    dep = one(objs, "Deployment", "specgate")
    account = dep["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "specgate"}]
    assert one(objs, "ServiceAccount", account)["automountServiceAccountToken"] is True
    assert dep["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    cfg, _ = gateway_config(objs)
    (model,) = cfg.models
    d = model.discovery
    assert model.pairs == [] and d is not None and d.kind == "kubernetes"
    service = one(objs, "Service", d.service or "")
    assert d.selector == f"kubernetes.io/service-name={service['metadata']['name']}"
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert d.spec is not None and ports[d.spec.port_name or ""] == d.spec.port
    assert ports[d.base.port_name or ""] == d.base.port
    # the overlays themselves do not talk to the API
    for overlay in PAIR_OVERLAYS:
        assert not find(docs(K8S / "overlays" / overlay), "Role")
