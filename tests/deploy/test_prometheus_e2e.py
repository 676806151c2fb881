"""The dashboard and the alert rules, proven on a real Prometheus.

A real ``prometheus`` scrapes the gateway (its real app, with telemetry) and an emulated
engine pair under a short streaming load; every PromQL expression of the Grafana
dashboard and of the alert rules is then evaluated through Prometheus's HTTP API and must
return data. ``promtool`` checks the shipped config, the rules and the gateway's /metrics.

Without the binaries the test is skipped (``make system-deps`` installs them), except
in CI (``CI=true``), where a missing binary is a failure.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

import gateway.api.app  # noqa: F401  (imported here, not on the event loop)
import specgate_lab.emulator.launch  # noqa: F401
from specgate_lab.promlab import Lab, run_load, start_lab
from tests.deploy.helpers import require_tool

REPO = Path(__file__).resolve().parents[2]
DASHBOARD = REPO / "deploy" / "grafana" / "dashboards" / "specgate.json"
MAKE_DASHBOARD = REPO / "deploy" / "grafana" / "make_dashboard.py"
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
PROM_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"
ALERT_TESTS = REPO / "deploy" / "prometheus" / "alerts_test.yml"
DEADLINE_S = 45.0
# Long enough to cover the whole test run, so every rate() sees the load.
TEST_RATE_INTERVAL = "1m"


def dashboard_queries() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            out.append((f"{panel['title']} [{t['refId']}]", t["expr"]))
    return out


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def for_test(expr: str) -> str:
    """Grafana variables to what a short test can evaluate."""
    return expr.replace("$__rate_interval", TEST_RATE_INTERVAL).replace("$model", ".*")


_CMP = re.compile(r"(==|!=|>=|<=|>|<)(\s*bool\b)?")


def with_bool(expr: str) -> str:
    """Turn every comparison outside label matchers into a ``bool`` comparison.

    An alert expression filters to nothing while all is well; with ``bool`` it returns
    0/1 for every series it watches, so "returns data" proves that all its selectors
    match and its vector matching joins.
    """
    out, depth, quote, i = [], 0, "", 0
    while i < len(expr):
        c = expr[i]
        if quote:
            out.append(c)
            if c == "\\" and i + 1 < len(expr):
                out.append(expr[i + 1])
                i += 1
            elif c == quote:
                quote = ""
            i += 1
            continue
        if c in "\"'":
            quote = c
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
        elif depth == 0:
            m = _CMP.match(expr, i)
            if m:
                out.append(m.group(0) if m.group(2) else m.group(1) + " bool")
                i = m.end()
                continue
        out.append(c)
        i += 1
    return "".join(out)


def test_with_bool_rewrites_comparisons_only() -> None:
    e = 'sum by (m) (rate(x{route!="none",s=~"5.."}[5m])) > 0.05 and on (m) y < on (m) z'
    assert (
        with_bool(e)
        == 'sum by (m) (rate(x{route!="none",s=~"5.."}[5m])) > bool 0.05 and on (m) y < bool on (m) z'
    )
    assert with_bool("a >= bool 1") == "a >= bool 1"


async def _run(*cmd: str, stdin: bytes | None = None) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(stdin), 60)
    return proc.returncode or 0, out.decode(errors="replace")


async def test_shipped_config_rules_and_dashboard_are_valid() -> None:
    promtool = require_tool("promtool")
    rc, out = await _run(promtool, "check", "config", str(PROM_CONFIG))
    assert rc == 0, out
    rc, out = await _run(promtool, "check", "rules", str(ALERTS))
    assert rc == 0, out
    # Each alert fires on its condition after its `for`, and stays quiet otherwise.
    rc, out = await _run(promtool, "test", "rules", str(ALERT_TESTS))
    assert rc == 0, out
    tested = set(re.findall(r"alertname: (\w+)", ALERT_TESTS.read_text()))
    assert tested == {r["alert"] for r in alert_rules()}
    rc, out = await _run(sys.executable, str(MAKE_DASHBOARD), "--check")
    assert rc == 0, f"dashboard JSON out of date with make_dashboard.py: {out}"
    queries = dashboard_queries()
    assert len(queries) >= 20
    assert all("$__rate_interval" in q or "rate(" not in q for _, q in queries)


def _has_finite(result: list[dict[str, Any]]) -> bool:
    for series in result:
        value = series.get("value")
        if value is not None and math.isfinite(float(value[1])):
            return True
    return False


async def _all_with_data(lab: Lab, session: aiohttp.ClientSession, queries: dict[str, str]) -> dict[str, str]:
    """Name -> why it failed, for every query that returns no finite sample yet."""
    missing: dict[str, str] = {}
    for name, expr in queries.items():
        result = await lab.query(session, expr)  # a PromQL error raises: no retry for bad syntax
        if not _has_finite(result):
            missing[name] = f"{expr} -> {json.dumps(result)[:300]}"
    return missing


@pytest.mark.prometheus
@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_every_dashboard_and_alert_query_returns_data(tmp_path: Path) -> None:
    prometheus = require_tool("prometheus")
    promtool = require_tool("promtool")
    queries = {name: for_test(expr) for name, expr in dashboard_queries()}
    rules = alert_rules()
    for rule in rules:
        queries[f"alert {rule['alert']}"] = with_bool(rule["expr"].strip())

    lab = await start_lab(tmp_path / "lab", rule_files=[str(ALERTS)], prometheus=prometheus)
    stop = asyncio.Event()
    load = asyncio.create_task(run_load(lab.gateway_url, stop, concurrency=3))
    try:
        async with aiohttp.ClientSession() as session:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + DEADLINE_S
            missing = await _all_with_data(lab, session, queries)
            while missing and loop.time() < deadline:
                await asyncio.sleep(1.0)
                missing = await _all_with_data(lab, session, queries)
            assert not missing, "queries without data:\n" + "\n".join(
                f"- {k}: {v}" for k, v in missing.items()
            )

            # Prometheus evaluated every rule without error; the dead engine's alert is on its way.
            async with session.get(f"{lab.prometheus_url}/api/v1/rules") as r:
                groups = (await r.json())["data"]["groups"]
            loaded = {rule["name"]: rule for g in groups for rule in g["rules"]}
            assert set(loaded) == {r["alert"] for r in rules}
            for name, rule in loaded.items():
                assert rule["health"] == "ok", f"{name}: {rule.get('lastError')}"
            down = [a["labels"].get("engine") for a in loaded["SpecgateEngineDown"]["alerts"]]
            assert "deadspec" in down
            assert "spec0" not in down and "base0" not in down

            # The gateway's real /metrics passes promtool's linter.
            async with session.get(f"{lab.gateway_url}/metrics") as r:
                assert r.status == 200
                exposition = await r.read()
            rc, out = await _run(promtool, "check", "metrics", stdin=exposition)
            assert rc == 0, out
            assert b"specgate_routing_break_even_acceptance_length" in exposition

        rc, out = await _run(promtool, "check", "config", str(lab.config_path))
        assert rc == 0, out
    finally:
        stop.set()
        await asyncio.wait_for(load, 30)
        await lab.stop()
