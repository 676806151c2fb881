"""deploy/k8s/components/epp: Endpoint Picker mode on Kubernetes.

Built into the engine-pair overlays (through a throw-away kustomization, as
``test_k8s.with_component`` does), every object validates — the standard kinds against the
Kubernetes schemas (strict), the InferencePool and the HTTPRoute against the fields of
their CRDs (inference.networking.k8s.io/v1, gateway.networking.k8s.io/v1), transcribed
below strictly — and the wiring holds: the InferencePool's ``endpointPickerRef`` names the
specgate Service's h2c port, which reaches the container port the Deployment's
``--epp-port`` serves and its gRPC readiness probe checks; its selector picks exactly the
engine pair pods, its target ports are the engines' ports, and the gateway config
addresses those engines by names that resolve to the same pod IPs.

Without a kustomize binary the component's patches (JSON 6902, which the offline renderer of
``tests/deploy/kustomize.py`` does not support) are applied here; with one, that
application is checked against it.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kubernetes_validate
import pytest
import yaml

from gateway.cli import build_parser
from gateway.config import GatewayConfig, load_config
from tests.deploy import kustomize
from tests.deploy.helpers import K8S, REPO, find, one

Doc = dict[str, Any]

K8S_VERSION = kubernetes_validate.latest_version()
COMPONENT = K8S / "components" / "epp"
OVERLAYS = ("gpu", "emulated")  # the overlays that run engine pairs (real, emulated)
GATEWAY_CONFIG = Path("/etc/specgate")

# ---- the CRDs' fields (strict) -----------------------------------------------------------------

_DNS_LABEL = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_GROUP = r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_KIND = "^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$"
_LABEL_VALUE = "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
_DURATION = "^([0-9]{1,5}(h|m|s|ms)){1,4}$"  # Gateway API (GEP-2257)
_PORT = {"type": "integer", "minimum": 1, "maximum": 65535}


def _strict(properties: Doc, required: tuple[str, ...] = ()) -> Doc:
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
        "required": list(required),
    }


def _resource(api_version: str, kind: str, spec: Doc) -> Doc:
    metadata = {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {"type": "string", "maxLength": 253, "pattern": _DNS_SUBDOMAIN},
            "namespace": {"type": "string", "maxLength": 63, "pattern": _DNS_LABEL},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    }
    return _strict(
        {"apiVersion": {"const": api_version}, "kind": {"const": kind}, "metadata": metadata, "spec": spec},
        ("apiVersion", "kind", "metadata", "spec"),
    )


# inference.networking.k8s.io/v1 InferencePool (config/crd/bases of the Gateway API Inference
# Extension); endpointPickerRef is optional in the CRD but required here.
INFERENCEPOOL_SCHEMA = _resource(
    "inference.networking.k8s.io/v1",
    "InferencePool",
    _strict(
        {
            "appProtocol": {"enum": ["http", "kubernetes.io/h2c"]},
            "selector": _strict(
                {
                    "matchLabels": {
                        "type": "object",
                        "minProperties": 1,
                        "maxProperties": 64,
                        "additionalProperties": {"type": "string", "maxLength": 63, "pattern": _LABEL_VALUE},
                    }
                },
                ("matchLabels",),
            ),
            "targetPorts": {
                "type": "array",
                "minItems": 1,
                "maxItems": 8,
                "uniqueItems": True,  # the CRD: "port number must be unique"
                "items": _strict({"number": _PORT}, ("number",)),
            },
            "endpointPickerRef": {
                **_strict(
                    {
                        "group": {"type": "string", "maxLength": 253, "pattern": _GROUP},
                        "kind": {"type": "string", "minLength": 1, "maxLength": 63, "pattern": _KIND},
                        "name": {"type": "string", "minLength": 1, "maxLength": 253},
                        "port": _strict({"number": _PORT}, ("number",)),
                        "failureMode": {"enum": ["FailOpen", "FailClose"]},
                    },
                    ("name",),
                ),
                # the CRD: "port is required when kind is 'Service' or unspecified"
                "anyOf": [
                    {"required": ["port"]},
                    {"required": ["kind"], "properties": {"kind": {"not": {"const": "Service"}}}},
                ],
            },
        },
        ("selector", "targetPorts", "endpointPickerRef"),
    ),
)

_PARENT_REF = _strict(
    {
        "group": {"type": "string", "maxLength": 253, "pattern": _GROUP},
        "kind": {"type": "string", "minLength": 1, "maxLength": 63, "pattern": _KIND},
        "namespace": {"type": "string", "minLength": 1, "maxLength": 63, "pattern": _DNS_LABEL},
        "name": {"type": "string", "minLength": 1, "maxLength": 253},
        "sectionName": {"type": "string", "minLength": 1, "maxLength": 253, "pattern": _DNS_SUBDOMAIN},
        "port": _PORT,
    },
    ("name",),
)
_BACKEND_REF = _strict(
    {
        "group": {"type": "string", "maxLength": 253, "pattern": _GROUP},
        "kind": {"type": "string", "minLength": 1, "maxLength": 63, "pattern": _KIND},
        "namespace": {"type": "string", "minLength": 1, "maxLength": 63, "pattern": _DNS_LABEL},
        "name": {"type": "string", "minLength": 1, "maxLength": 253},
        "port": _PORT,
        "weight": {"type": "integer", "minimum": 0, "maximum": 1_000_000},
        "filters": {"type": "array", "items": {"type": "object"}},
    },
    ("name",),
)
_MATCH = _strict(
    {
        "path": _strict(
            {
                "type": {"enum": ["Exact", "PathPrefix", "RegularExpression"]},
                "value": {"type": "string", "maxLength": 1024},
            }
        ),
        "headers": {"type": "array", "items": {"type": "object"}},
        "queryParams": {"type": "array", "items": {"type": "object"}},
        "method": {"enum": ["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"]},
    }
)
# gateway.networking.k8s.io/v1 HTTPRoute (standard channel), the fields a route may use here.
HTTPROUTE_SCHEMA = _resource(
    "gateway.networking.k8s.io/v1",
    "HTTPRoute",
    _strict(
        {
            "parentRefs": {"type": "array", "maxItems": 32, "items": _PARENT_REF},
            "hostnames": {"type": "array", "maxItems": 16, "items": {"type": "string"}},
            "rules": {
                "type": "array",
                "maxItems": 16,
                "items": _strict(
                    {
                        "name": {"type": "string", "pattern": _DNS_LABEL},
                        "matches": {"type": "array", "maxItems": 64, "items": _MATCH},
                        "filters": {"type": "array", "items": {"type": "object"}},
                        "backendRefs": {"type": "array", "maxItems": 16, "items": _BACKEND_REF},
                        "timeouts": _strict(
                            {
                                "request": {"type": "string", "pattern": _DURATION},
                                "backendRequest": {"type": "string", "pattern": _DURATION},
                            }
                        ),
                    }
                ),
            },
        }
    ),
)

# Schemas for the kinds kubernetes-validate does not know, by (apiVersion, kind).
EPP_CRD_SCHEMAS: dict[tuple[str, str], Doc] = {
    ("inference.networking.k8s.io/v1", "InferencePool"): INFERENCEPOOL_SCHEMA,
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): HTTPROUTE_SCHEMA,
}


def validate(obj: Doc) -> None:
    schema = EPP_CRD_SCHEMAS.get((obj["apiVersion"], obj["kind"]))
    if schema is not None:
        jsonschema.Draft202012Validator.check_schema(schema)
        jsonschema.Draft202012Validator(schema).validate(obj)
        return
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


# ---- building the component into an overlay ------------------------------------------------


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def apply_json6902(doc: Doc, ops: list[Doc]) -> None:
    """RFC 6902 ``add`` and ``replace`` (all the component uses), in place."""
    for op in ops:
        *parents, last = _pointer(op["path"])
        node: Any = doc
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if op["op"] == "add":
            if isinstance(node, list):
                node.insert(len(node) if last == "-" else int(last), op["value"])
            else:
                node[last] = op["value"]
        elif op["op"] == "replace":
            if isinstance(node, list):
                node[int(last)] = op["value"]
            else:
                assert last in node, f"replace of a missing {op['path']}"
                node[last] = op["value"]
        else:
            raise AssertionError(f"unsupported patch op {op['op']}")


def _targets(doc: Doc, target: Doc) -> bool:
    group, _, version = doc["apiVersion"].rpartition("/")
    return (
        doc["kind"] == target.get("kind", doc["kind"])
        and doc["metadata"]["name"] == target.get("name", doc["metadata"]["name"])
        and group == target.get("group", group)
        and version == target.get("version", version)
    )


def namespace(overlay: str) -> str:
    """The overlay's namespace: the throw-away kustomization puts the component's objects there."""
    ns = kustomize._load(kustomize.kustomization_file(K8S / "overlays" / overlay))["namespace"]
    assert isinstance(ns, str)
    return ns


def build_in_python(overlay: str) -> list[Doc]:
    """The overlay plus the component, offline: its resources, then its patches."""
    docs = kustomize.build_in_python(K8S / "overlays" / overlay)
    k = kustomize._load(kustomize.kustomization_file(COMPONENT))
    assert k["kind"] == "Component"
    assert set(k) <= {"apiVersion", "kind", "resources", "patches"}, sorted(k)
    for ref in k["resources"]:
        docs += copy.deepcopy(kustomize._docs(COMPONENT / ref))
    for patch in k["patches"]:
        matched = [d for d in docs if _targets(d, patch["target"])]
        assert len(matched) == 1, f"patch target {patch['target']} matches {len(matched)} objects"
        apply_json6902(matched[0], yaml.safe_load(patch["patch"]))
    for d in docs:
        if d["kind"] not in kustomize.CLUSTER_SCOPED:
            d["metadata"]["namespace"] = namespace(overlay)
    return docs


def build_with_binary(overlay: str, tmp_path: Path) -> list[Doc]:
    k = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "namespace": namespace(overlay),
        # kustomize refuses absolute paths
        "resources": [os.path.relpath(K8S / "overlays" / overlay, tmp_path)],
        "components": [os.path.relpath(COMPONENT, tmp_path)],
    }
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(k), encoding="utf-8")
    return kustomize.build_with_binary(tmp_path)


def build(overlay: str, tmp_path: Path) -> list[Doc]:
    """The overlay with the component (the real kustomize when installed), every object validated."""
    if kustomize.kustomize_command() is not None:
        objs = build_with_binary(overlay, tmp_path)
    else:
        objs = build_in_python(overlay)
    for obj in objs:
        validate(obj)
    return objs


def _identity(obj: Doc) -> tuple[str, str]:
    name = obj["metadata"]["name"]
    if obj["kind"] == "ConfigMap":
        name = re.sub(r"-[a-z0-9]{10}$", "", name)  # kustomize's content-hash suffix
    return obj["kind"], name


def gateway_container(objs: list[Doc]) -> Doc:
    (container,) = one(objs, "Deployment", "specgate")["spec"]["template"]["spec"]["containers"]
    return container  # type: ignore[no-any-return]


def gateway_config(objs: list[Doc], tmp_path: Path) -> GatewayConfig:
    """The gateway config the Deployment mounts, loaded."""
    pod = one(objs, "Deployment", "specgate")["spec"]["template"]["spec"]
    container = gateway_container(objs)
    mount = next(m for m in container["volumeMounts"] if Path(m["mountPath"]) == GATEWAY_CONFIG)
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    cm = one(objs, "ConfigMap", volume["configMap"]["name"])
    args = container["args"]
    path = Path(args[args.index("--config") + 1])
    file = tmp_path / "gateway-config" / path.name
    file.parent.mkdir()
    file.write_text(cm["data"][path.name], encoding="utf-8")
    return load_config(file, env={})


# ---- the tests -----------------------------------------------------------------------------------


def test_the_component_files_parse_and_validate() -> None:
    k = kustomize._load(kustomize.kustomization_file(COMPONENT))
    kinds = set()
    for ref in k["resources"]:
        for obj in kustomize._docs(COMPONENT / ref):
            validate(obj)
            kinds.add((obj["apiVersion"], obj["kind"]))
    assert kinds == set(EPP_CRD_SCHEMAS)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_component_adds_the_pool_and_the_route_and_changes_only_the_gateway(
    tmp_path: Path, overlay: str
) -> None:
    objs = build(overlay, tmp_path)
    pool = one(objs, "InferencePool")
    route = one(objs, "HTTPRoute")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    dep = one(objs, "Deployment", "specgate")
    for obj in (pool, route):
        assert obj["metadata"]["namespace"] == dep["metadata"]["namespace"] == namespace(overlay)
    without = kustomize.render(K8S / "overlays" / overlay)
    assert {_identity(o) for o in objs} - {_identity(o) for o in without} == {
        ("InferencePool", pool["metadata"]["name"]),
        ("HTTPRoute", route["metadata"]["name"]),
    }
    assert len(objs) == len(without) + 2


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_endpoint_picker_ref_reaches_the_port_the_gateway_serves_its_epp_on(
    tmp_path: Path, overlay: str
) -> None:
    objs = build(overlay, tmp_path)
    pool = one(objs, "InferencePool")
    ref = pool["spec"]["endpointPickerRef"]
    assert ref.get("group", "") == "" and ref.get("kind", "Service") == "Service"
    assert ref.get("failureMode", "FailClose") == "FailClose"
    service = one(objs, "Service", ref["name"])
    (grpc_port,) = [p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    assert grpc_port["name"] == "grpc"
    assert grpc_port["appProtocol"] == "kubernetes.io/h2c"
    dep = one(objs, "Deployment", "specgate")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    container = gateway_container(objs)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    target = grpc_port["targetPort"]
    container_port = ports[target] if isinstance(target, str) else target
    assert container_port == ports["grpc"]

    # What `specgate serve` makes of the Deployment's args: the real CLI parser.
    args = container["args"]
    ns = build_parser(args).parse_args(args)
    assert ns.command == "serve"
    assert ns.epp_port == container_port == ref["port"]["number"]
    assert ns.epp_host == "0.0.0.0"
    cfg = gateway_config(objs, tmp_path)
    epp = load_config(
        None, env={}, overrides={"epp.enabled": True, "epp.port": ns.epp_port, "epp.host": ns.epp_host}
    ).epp
    assert epp.enabled and epp.port == container_port
    assert ns.epp_port != cfg.server.port, "the HTTP port keeps /metrics, /health, /ready, /admin"

    # Ready = the EPP's gRPC health service "readiness"; alive = HTTP /health as before.
    probe = container["readinessProbe"]
    handlers = {"httpGet", "grpc", "tcpSocket", "exec"} & set(probe)
    assert handlers == {"grpc"}
    assert probe["grpc"] == {"port": container_port, "service": "readiness"}
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    # /metrics is still scraped on the HTTP port
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) == cfg.server.port


def _duration_s(text: str) -> float:
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * units[u] for n, u in re.findall(r"([0-9]+)(ms|h|m|s)", text))


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_pool_is_the_engine_pods_and_the_config_names_them_by_the_same_addresses(
    tmp_path: Path, overlay: str
) -> None:
    objs = build(overlay, tmp_path)
    pool = one(objs, "InferencePool")
    selector = pool["spec"]["selector"]["matchLabels"]
    target_ports = {p["number"] for p in pool["spec"]["targetPorts"]}
    # The selector picks the pair pods, every one of them, and nothing else that runs.
    workloads = find(objs, "StatefulSet") + find(objs, "Deployment")
    selected = [
        w for w in workloads if selector.items() <= w["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert selected == find(objs, "StatefulSet") and selected
    engine_ports = {
        p["containerPort"]
        for sts in selected
        for c in sts["spec"]["template"]["spec"]["containers"]
        for p in c["ports"]
    }
    assert target_ports == engine_ports

    # The gateway config's engines: per-pod names of the pairs' headless Service, on the
    # pool's target ports, so the addresses specgate resolves are the pool's endpoints.
    cfg = gateway_config(objs, tmp_path)
    statefulsets = {s["metadata"]["name"]: s for s in selected}
    seen_ports = set()
    for model in cfg.models:
        for pair in model.pairs:
            for engine in (pair.spec, pair.base):
                assert engine is not None
                assert engine.endpoint is None, "pod IPs are not known ahead: the url's name resolves"
                url = urlsplit(engine.url)
                assert url.hostname is not None and url.port in target_ports
                m = re.fullmatch(r"(?P<sts>[a-z0-9-]+)-(?P<idx>\d+)\.(?P<svc>[a-z0-9-]+)", url.hostname)
                assert m, engine.url
                sts = statefulsets[m["sts"]]
                assert int(m["idx"]) < sts["spec"]["replicas"]
                headless = one(objs, "Service", m["svc"])
                assert sts["spec"]["serviceName"] == m["svc"]
                assert headless["spec"]["clusterIP"] == "None"
                # names resolve while a pair loads or restarts, not only once it is ready
                assert headless["spec"]["publishNotReadyAddresses"] is True
                seen_ports.add(url.port)
    assert seen_ports == target_ports

    route = one(objs, "HTTPRoute")
    (rule,) = route["spec"]["rules"]
    (backend,) = rule["backendRefs"]
    assert backend["group"] == "inference.networking.k8s.io"
    assert backend["kind"] == "InferencePool"
    assert backend["name"] == pool["metadata"]["name"]
    # the route lets a stream run as long as the gateway config allows it
    assert _duration_s(rule["timeouts"]["request"]) >= max(m.timeouts.total_s for m in cfg.models)
    (parent,) = route["spec"]["parentRefs"]
    assert parent.get("kind", "Gateway") == "Gateway"


@pytest.mark.skipif(kustomize.kustomize_command() is None, reason="no kustomize or kubectl installed")
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_offline_patches_match_kustomize(tmp_path: Path, overlay: str) -> None:
    """Where no kustomize binary exists the tests above build the component offline: that
    build must give what kustomize gives (ConfigMap names aside: kustomize hashes them)."""
    real = build_with_binary(overlay, tmp_path)
    ours = build_in_python(overlay)
    for kind, name in (("Service", "specgate"), ("InferencePool", None), ("HTTPRoute", None)):
        assert one(ours, kind, name) == one(real, kind, name), kind
    real_c, ours_c = gateway_container(real), gateway_container(ours)
    for key in ("args", "ports", "readinessProbe", "livenessProbe"):
        assert ours_c[key] == real_c[key], key


def test_the_crd_schemas_are_not_vacuous() -> None:
    pool = kustomize._docs(COMPONENT / "inferencepool.yaml")[0]
    validate(pool)
    bad = copy.deepcopy(pool)
    bad["spec"]["targetPortNumber"] = 8001  # v1alpha2's field
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
    bad = copy.deepcopy(pool)
    del bad["spec"]["endpointPickerRef"]["port"]  # a Service reference needs its port
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
    bad = copy.deepcopy(pool)
    bad["spec"]["targetPorts"].append(bad["spec"]["targetPorts"][0])
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
    route = kustomize._docs(COMPONENT / "httproute.yaml")[0]
    validate(route)
    bad = copy.deepcopy(route)
    bad["spec"]["rules"][0]["backendRef"] = bad["spec"]["rules"][0].pop("backendRefs")
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)
    bad = copy.deepcopy(route)
    bad["spec"]["rules"][0]["timeouts"]["request"] = "10 minutes"
    with pytest.raises(jsonschema.ValidationError):
        validate(bad)


def test_readme_documents_the_mode() -> None:
    text = (K8S / "README.md").read_text(encoding="utf-8")
    assert "## Endpoint Picker mode" in text
    assert "components/epp" in text
    assert (REPO / "deploy" / "envoy" / "README.md").is_file()
