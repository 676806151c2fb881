"""The monitoring resources for Kubernetes: the PrometheusRule holds exactly the rules of
deploy/prometheus/alerts.yml (and promtool accepts them), every alert links a runbook section
that exists, and the dashboard ConfigMap carries the Grafana sidecar's label and the
dashboard JSON unchanged. Both are built from the Prometheus Operator overlay, validated."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.deploy import kustomize
from tests.deploy.crds import PROMETHEUSRULE_SCHEMA
from tests.deploy.helpers import DEPLOY, K8S, REPO, load_module, one, require_tool
from tests.deploy.test_k8s import docs, validate

ALERTS = DEPLOY / "prometheus" / "alerts.yml"
MAKE_RULE = DEPLOY / "prometheus" / "make_prometheusrule.py"
RULE_FILE = K8S / "components" / "prometheus-rules" / "prometheusrule.yaml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "specgate.json"
RUNBOOKS = REPO / "docs" / "runbooks.md"
OPERATOR = K8S / "overlays" / "gpu-prometheus-operator"


def _alerts() -> dict[str, Any]:
    data = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _rules() -> list[dict[str, Any]]:
    return [r for g in _alerts()["groups"] for r in g["rules"]]


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the page's headings (lower case, spaces to '-', punctuation dropped)."""
    heads = re.findall(r"^#{1,6} (.+)$", markdown, re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


def test_the_prometheusrule_holds_exactly_the_rule_files_rules() -> None:
    objs = docs(OPERATOR)
    rule = one(objs, "PrometheusRule", "specgate")
    assert rule["metadata"]["namespace"] == "specgate"
    validate(rule)
    assert rule["spec"]["groups"] == _alerts()["groups"]
    make = subprocess.run(
        [sys.executable, str(MAKE_RULE), "--check"], capture_output=True, text=True, timeout=60
    )
    assert make.returncode == 0, f"{make.stderr} (run: python deploy/prometheus/make_prometheusrule.py)"


def test_the_prometheusrule_schema_is_not_vacuous() -> None:
    rule = kustomize._docs(RULE_FILE)[0]
    jsonschema.validate(rule, PROMETHEUSRULE_SCHEMA)
    for breakage in (
        lambda r: r["spec"]["groups"][0]["rules"][0].pop("expr"),
        lambda r: r["spec"]["groups"][0]["rules"][0].update({"for": "15 minutes"}),
        lambda r: r["spec"]["groups"][0]["rules"][0].update({"annotation": {}}),
        lambda r: r["spec"]["groups"][0]["rules"][0]["labels"].update({"severity": 2}),
        lambda r: r["spec"].update({"group": []}),
    ):
        bad = copy.deepcopy(rule)
        breakage(bad)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, PROMETHEUSRULE_SCHEMA)


def test_the_generator_puts_a_hosted_runbook_base_before_each_link() -> None:
    make = load_module(MAKE_RULE, "make_prometheusrule")
    text = make.render("https://docs.example.com/specgate/")
    groups = yaml.safe_load(text.split("\n", 5)[-1])["spec"]["groups"]
    urls = [r["annotations"]["runbook_url"] for g in groups for r in g["rules"]]
    assert urls and all(u.startswith("https://docs.example.com/specgate/docs/runbooks.md#") for u in urls)


def test_every_alert_links_its_runbook_section() -> None:
    anchors = _anchors(RUNBOOKS.read_text(encoding="utf-8"))
    names = {r["alert"] for r in _rules()}
    for rule in _rules():
        url = rule["annotations"].get("runbook_url", "")
        page, _, anchor = url.partition("#")
        assert page == "docs/runbooks.md", f"{rule['alert']}: runbook_url {url!r}"
        assert anchor == rule["alert"].lower() and anchor in anchors, (
            f"{rule['alert']}: no section {anchor!r}"
        )
    # and no section of an alert that no longer exists
    sections = set(re.findall(r"^## (Specgate\w+)$", RUNBOOKS.read_text(encoding="utf-8"), re.M))
    assert sections == names
    for section in re.findall(r"^## (Specgate\w+)\n(.*?)(?=^## |\Z)", RUNBOOKS.read_text(), re.M | re.S):
        for part in ("**What it means.**", "**How to check.**", "**What to do.**"):
            assert part in section[1], f"runbook {section[0]} lacks {part}"


def test_promtool_accepts_the_prometheusrules_groups(tmp_path: Path) -> None:
    promtool = require_tool("promtool")
    rule = kustomize._docs(RULE_FILE)[0]
    rules_file = tmp_path / "rules.yml"
    rules_file.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}), encoding="utf-8")
    for path in (ALERTS, rules_file):
        check = subprocess.run(
            [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
        )
        assert check.returncode == 0, check.stdout + check.stderr
        assert f"SUCCESS: {len(_rules())} rules found" in check.stdout


@pytest.mark.parametrize("renderer", ["python", "kustomize"])
def test_the_dashboard_configmap_is_labelled_for_the_grafana_sidecar(renderer: str) -> None:
    if renderer == "kustomize" and kustomize.kustomize_command() is None:
        pytest.skip("no kustomize or kubectl installed")
    objs = (
        kustomize.build_in_python(OPERATOR) if renderer == "python" else kustomize.build_with_binary(OPERATOR)
    )
    cm = one(objs, "ConfigMap", "specgate-dashboard")  # a stable name: no content hash
    validate(cm)
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "specgate"
    assert cm["data"] == {"specgate.json": DASHBOARD.read_text(encoding="utf-8")}
    dashboard = json.loads(cm["data"]["specgate.json"])
    assert dashboard["uid"] and dashboard["panels"]
    assert {"datasource", "model"} <= {v["name"] for v in dashboard["templating"]["list"]}
