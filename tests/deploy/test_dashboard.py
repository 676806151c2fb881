"""Structure of the Grafana dashboard and its provisioning (the queries run in test_prometheus_e2e)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "grafana"
DASH = json.loads((GRAFANA / "dashboards" / "specgate.json").read_text())

REQUIRED_PANELS = {
    "Route share",
    "Acceptance rate per engine",
    "Mean acceptance length per engine",
    "Per-position acceptance",
    "Break-even vs measured acceptance length",
    "Time per output token p50 / p99 by route",
    "Time to first token p50 / p99 by route",
    "Running / waiting requests",
    "KV cache usage",
    "Scrape health",
    "Error ratio (5xx, 4xx)",
    "Upstream failures and retries",
    "Regime per pair (1 = speculating, 0 = plain)",
    "Speculating pairs: now, planned, of all",
    "Load per pair (requests, as placement counts them)",
    "Running / waiting per pair and engine",
}


def test_panels_present_unique_and_not_overlapping() -> None:
    panels = DASH["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    titles = {p["title"] for p in panels if p["type"] != "row"}
    assert titles >= REQUIRED_PANELS
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not (mine & cells), f"panel {p['title']!r} overlaps another"
        cells |= mine


def test_targets_use_the_datasource_variable_and_unique_ref_ids() -> None:
    names = {v["name"] for v in DASH["templating"]["list"]}
    assert {"datasource", "model"} <= names
    for p in DASH["panels"]:
        if p["type"] == "row":
            continue
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs))
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}"
            assert t["expr"].strip()
            if "specgate_" in t["expr"] and "model" in t["expr"]:
                assert "$model" in t["expr"] or "by (engine" in t["expr"]


def test_provisioning_points_at_the_dashboards() -> None:
    ds = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert ds["datasources"][0]["type"] == "prometheus"
    prov = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "specgate.yml").read_text())
    assert prov["providers"][0]["type"] == "file"
    assert prov["providers"][0]["options"]["path"].endswith("/specgate")
