#!/usr/bin/env python3
"""Write the alert rules of ``alerts.yml`` as a Prometheus Operator ``PrometheusRule``
(``deploy/k8s/components/prometheus-rules/prometheusrule.yaml``).

    python deploy/prometheus/make_prometheusrule.py          # rewrite the resource
    python deploy/prometheus/make_prometheusrule.py --check  # exit 1 if it is out of date
    python deploy/prometheus/make_prometheusrule.py --runbook-base https://docs.example.com/specgate/ \\
        --out my-rules.yaml                                  # runbook links to a copy you host

``alerts.yml`` stays the one source (promtool checks and unit-tests it); the test suite
fails when the resource's rules differ from it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ALERTS = HERE / "alerts.yml"
OUT = HERE.parent / "k8s" / "components" / "prometheus-rules" / "prometheusrule.yaml"
HEADER = """\
# Generated from deploy/prometheus/alerts.yml by deploy/prometheus/make_prometheusrule.py:
# edit alerts.yml, then run the script (the test suite fails when they differ).
# The Prometheus Operator loads PrometheusRules that match its ruleSelector: with
# kube-prometheus-stack, add its release label (e.g. release: kube-prometheus-stack) in
# your overlay, or set ruleSelectorNilUsesHelmValues: false.
"""


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def prometheus_rule(alerts: dict[str, Any], runbook_base: str = "") -> dict[str, Any]:
    groups = alerts["groups"]
    if runbook_base:
        for group in groups:
            for rule in group["rules"]:
                notes = rule.get("annotations", {})
                if "runbook_url" in notes:
                    notes["runbook_url"] = runbook_base.rstrip("/") + "/" + notes["runbook_url"]
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "specgate",
            "labels": {"app.kubernetes.io/name": "specgate", "app.kubernetes.io/component": "alerts"},
        },
        "spec": {"groups": groups},
    }


def render(runbook_base: str = "") -> str:
    alerts = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    body = yaml.dump(
        prometheus_rule(alerts, runbook_base), Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True
    )
    return HEADER + body


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 when the resource is out of date")
    ap.add_argument(
        "--runbook-base",
        default="",
        help="URL put before each runbook_url (docs/runbooks.md#...): where you host the repository",
    )
    ap.add_argument(
        "--out", type=Path, default=OUT, help=f"where to write (default: {OUT.name} in the component)"
    )
    args = ap.parse_args()
    text = render(args.runbook_base)
    if args.check:
        if not args.out.is_file() or args.out.read_text(encoding="utf-8") != text:
            print(
                f"{args.out} is out of date: run python deploy/prometheus/make_prometheusrule.py",
                file=sys.stderr,
            )
            return 1
        return 0
    args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
