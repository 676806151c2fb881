#!/usr/bin/env python3
"""Generate ``dashboards/specgate.json`` (the Grafana dashboard) from the panel list below.

    python deploy/grafana/make_dashboard.py          # rewrite the JSON
    python deploy/grafana/make_dashboard.py --check  # exit 1 if the JSON is out of date

Every query uses ``$__rate_interval`` for rate windows and ``$model`` for the model
variable; the test suite evaluates each one against a real Prometheus.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "dashboards" / "specgate.json"
DS = {"type": "prometheus", "uid": "${datasource}"}
RI = "$__rate_interval"
M = 'model=~"$model"'
ROUTED = M + ',route!="none"'
ON_BASE = M + ',route="base"'
ON_SPEC = M + ',route="spec"'
S5XX = M + ',status=~"5.."'
S4XX = M + ',status=~"4.."'
TPOT = "specgate_time_per_output_token_seconds"
REQS = "specgate_requests_total"


def _rate(metric: str, sel: str = "", by: str = "") -> str:
    grouping = f"sum by ({by}) " if by else "sum "
    selector = f"{{{sel}}}" if sel else ""
    return f"{grouping}(rate({metric}{selector}[{RI}]))"


def _mean(metric: str, sel: str) -> str:
    """Mean of a histogram over the window: rate(sum) / rate(count)."""
    return f"({_rate(metric + '_sum', sel)} / {_rate(metric + '_count', sel)})"


def _q(quantile: float, metric: str, sel: str, by: str) -> str:
    return f"histogram_quantile({quantile}, sum by (le, {by}) (rate({metric}_bucket{{{sel}}}[{RI}])))"


# (row, title, unit, [(expr, legend)], extra field config)
PANELS: list[tuple[str, str, str, list[tuple[str, str]], dict[str, Any]]] = [
    (
        "Routing",
        "Route share",
        "percentunit",
        [
            (
                f"{_rate(REQS, ROUTED, 'route')} / ignoring (route) group_left () {_rate(REQS, ROUTED)}",
                "{{route}}",
            )
        ],
        {"stack": True},
    ),
    (
        "Routing",
        "Requests by route and reason",
        "reqps",
        [
            (_rate("specgate_requests_total", M, "route, reason"), "{{route}} / {{reason}}"),
            (
                _rate("specgate_stream_moves_total", "", "engine, result"),
                "streams off {{engine}} at a flip: {{result}}",
            ),
        ],
        {},
    ),
    (
        "Routing",
        "Routing mode and probe share",
        "none",
        [
            (f"max by (model, mode) (specgate_routing_mode{{{M}}})", "mode {{mode}}"),
            (f"max by (model) (specgate_routing_probe_share{{{M}}})", "probe share"),
        ],
        {},
    ),
    (
        "Routing",
        "Predicted speed-up vs measured",
        "none",
        [
            (
                f"max by (model) (specgate_routing_predicted_speedup{{{M}}})",
                "predicted {{model}} (last decision)",
            ),
            (
                f"{_mean(TPOT, ON_BASE)} / {_mean(TPOT, ON_SPEC)}",
                "measured: mean TPOT base / spec",
            ),
        ],
        {},
    ),
    (
        "Routing",
        "Break-even vs measured acceptance length",
        "none",
        [
            (
                f"max by (model) (specgate_routing_break_even_acceptance_length{{{M}}})",
                "predicted break-even {{model}} (tokens/step)",
            ),
            (
                f"1 + {_rate('vllm:spec_decode_num_accepted_tokens_total', M, 'model')}"
                f" / {_rate('vllm:spec_decode_num_drafts_total', M, 'model')}",
                "measured {{model}} (vLLM counters)",
            ),
        ],
        {},
    ),
    (
        "Speculation",
        "Acceptance rate per engine",
        "percentunit",
        [
            (
                f"{_rate('vllm:spec_decode_num_accepted_tokens_total', M, 'engine_name')}"
                f" / {_rate('vllm:spec_decode_num_draft_tokens_total', M, 'engine_name')}",
                "{{engine_name}} (vLLM counters)",
            ),
            (f"max by (engine) (specgate_spec_acceptance_rate{{{M}}})", "{{engine}} (gateway window)"),
        ],
        {},
    ),
    (
        "Speculation",
        "Mean acceptance length per engine",
        "none",
        [
            (
                f"1 + {_rate('vllm:spec_decode_num_accepted_tokens_total', M, 'engine_name')}"
                f" / {_rate('vllm:spec_decode_num_drafts_total', M, 'engine_name')}",
                "{{engine_name}} (vLLM counters)",
            ),
            (f"max by (engine) (specgate_spec_mean_acceptance_length{{{M}}})", "{{engine}} (gateway window)"),
        ],
        {},
    ),
    (
        "Speculation",
        "Per-position acceptance",
        "percentunit",
        [
            (
                f"{_rate('vllm:spec_decode_num_accepted_tokens_per_pos_total', M, 'engine_name, position')}"
                f" / ignoring (position) group_left () "
                f"{_rate('vllm:spec_decode_num_drafts_total', M, 'engine_name')}",
                "{{engine_name}} pos {{position}} (vLLM)",
            ),
            (
                f"max by (engine, position) (specgate_spec_position_acceptance_rate{{{M}}})",
                "{{engine}} pos {{position}} (gateway)",
            ),
        ],
        {},
    ),
    (
        "Latency",
        "Time per output token p50 / p99 by route",
        "s",
        [
            (_q(0.5, "specgate_time_per_output_token_seconds", M, "route"), "p50 {{route}}"),
            (_q(0.99, "specgate_time_per_output_token_seconds", M, "route"), "p99 {{route}}"),
        ],
        {},
    ),
    (
        "Latency",
        "Time to first token p50 / p99 by route",
        "s",
        [
            (_q(0.5, "specgate_time_to_first_token_seconds", M, "route"), "p50 {{route}}"),
            (_q(0.99, "specgate_time_to_first_token_seconds", M, "route"), "p99 {{route}}"),
        ],
        {},
    ),
    (
        "Latency",
        "Engine time per output token p50 (vLLM histogram)",
        "s",
        [(_q(0.5, "vllm:request_time_per_output_token_seconds", M, "engine_name"), "{{engine_name}}")],
        {},
    ),
    (
        "Latency",
        "Routing decision latency p99",
        "s",
        [(_q(0.99, "specgate_decision_duration_seconds", M, "model"), "{{model}}")],
        {},
    ),
    (
        "Fleet: each pair's regime and load",
        "Regime per pair (1 = speculating, 0 = plain)",
        "none",
        [(f"max by (model, pair) (specgate_pair_speculating{{{M}}})", "{{pair}}")],
        {},
    ),
    (
        "Fleet: each pair's regime and load",
        "Speculating pairs: now, planned, of all",
        "none",
        [
            (f"max by (model) (specgate_fleet_speculating_pairs{{{M}}})", "speculating {{model}}"),
            (f"max by (model) (specgate_fleet_planned_speculating_pairs{{{M}}})", "planned {{model}}"),
            (f"max by (model) (specgate_fleet_pairs{{{M}}})", "pairs {{model}}"),
        ],
        {},
    ),
    (
        "Fleet: each pair's regime and load",
        "Load per pair (requests, as placement counts them)",
        "none",
        [(f"max by (model, pair) (specgate_pair_load_requests{{{M}}})", "{{pair}}")],
        {},
    ),
    (
        "Fleet: each pair's regime and load",
        "Running / waiting per pair and engine",
        "none",
        [
            (
                f"max by (model, pair, route) (specgate_pair_engine_running_requests{{{M}}})",
                "running {{pair}} {{route}}",
            ),
            (
                f"max by (model, pair, route) (specgate_pair_engine_waiting_requests{{{M}}})",
                "waiting {{pair}} {{route}}",
            ),
        ],
        {},
    ),
    (
        "Engines",
        "Running / waiting requests",
        "none",
        [
            (f"sum by (engine_name) (vllm:num_requests_running{{{M}}})", "running {{engine_name}}"),
            (f"sum by (engine_name) (vllm:num_requests_waiting{{{M}}})", "waiting {{engine_name}}"),
            ("sum by (engine) (specgate_upstream_inflight_requests)", "gateway in-flight {{engine}}"),
        ],
        {},
    ),
    (
        "Engines",
        "KV cache usage",
        "percentunit",
        [(f"max by (engine_name) (vllm:kv_cache_usage_perc{{{M}}})", "{{engine_name}}")],
        {},
    ),
    (
        "Engines",
        "Scrape health",
        "none",
        [
            ('up{job=~"specgate|vllm"}', "up {{job}} {{engine_name}}"),
            (f"max by (engine) (specgate_engine_stale{{{M}}})", "stale (gateway) {{engine}}"),
            ("max by (engine) (specgate_engine_scrape_age_seconds)", "scrape age s {{engine}}"),
            (_rate("specgate_engine_scrapes_total", "", "engine, result"), "scrapes/s {{engine}} {{result}}"),
        ],
        {},
    ),
    (
        "Errors",
        "Error ratio (5xx, 4xx)",
        "percentunit",
        [
            (
                f"({_rate(REQS, S5XX, 'model')}"
                f" or {_rate(REQS, M, 'model')} * 0)"
                f" / {_rate(REQS, M, 'model')}",
                "5xx {{model}}",
            ),
            (
                f"({_rate(REQS, S4XX, 'model')}"
                f" or {_rate(REQS, M, 'model')} * 0)"
                f" / {_rate(REQS, M, 'model')}",
                "4xx {{model}}",
            ),
        ],
        {},
    ),
    (
        "Replicas",
        "Peer channel: leaders and replicas heard",
        "none",
        [
            ("sum(specgate_peer_leader)", "leaders (1 when joined)"),
            ("max by (instance) (specgate_peer_replicas)", "replicas heard by {{instance}}"),
        ],
        {},
    ),
    (
        "Replicas",
        "Peer channel messages",
        "ops",
        [(_rate("specgate_peer_messages_total", "", "result"), "{{result}}")],
        {},
    ),
    (
        "Advice: what n-gram or suffix speculation would buy on this traffic",
        "Drafted tokens the proposer would have accepted",
        "percentunit",
        [
            (
                f"max by (proposer, kind, temperature) (specgate_advice_acceptance_rate{{{M}}})",
                "{{proposer}} {{kind}} T {{temperature}}",
            )
        ],
        {},
    ),
    (
        "Advice: what n-gram or suffix speculation would buy on this traffic",
        "Predicted speed-up by requests in flight",
        "none",
        [
            (
                f"max by (proposer, load) (specgate_advice_predicted_speedup{{{M}}})",
                "{{proposer}}, {{load}} in flight",
            )
        ],
        {},
    ),
    (
        "Errors",
        "Upstream failures and retries",
        "reqps",
        [
            (_rate("specgate_upstream_failures_total", "", "engine, error"), "failed {{engine}} {{error}}"),
            (_rate("specgate_upstream_retries_total", "", "engine, error"), "retried {{engine}} {{error}}"),
        ],
        {},
    ),
]


def _panel(
    pid: int, x: int, y: int, title: str, unit: str, targets: list[tuple[str, str]], extra: dict[str, Any]
) -> dict[str, Any]:
    custom: dict[str, Any] = {"lineWidth": 1, "fillOpacity": 10, "showPoints": "never"}
    if extra.get("stack"):
        custom.update({"stacking": {"mode": "normal", "group": "A"}, "fillOpacity": 60})
    return {
        "id": pid,
        "type": "timeseries",
        "title": title,
        "datasource": DS,
        "gridPos": {"h": 8, "w": 12, "x": x, "y": y},
        "fieldConfig": {"defaults": {"unit": unit, "custom": custom}, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom"}, "tooltip": {"mode": "multi"}},
        "targets": [
            {
                "refId": chr(ord("A") + i),
                "datasource": DS,
                "expr": expr,
                "legendFormat": legend,
                "range": True,
            }
            for i, (expr, legend) in enumerate(targets)
        ],
    }


def build() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    pid, y, col, row = 1, 0, 0, None
    for row_title, title, unit, targets, extra in PANELS:
        if row_title != row:
            if col:
                y += 8
            col, row = 0, row_title
            panels.append(
                {
                    "id": pid,
                    "type": "row",
                    "title": row_title,
                    "collapsed": False,
                    "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                    "panels": [],
                }
            )
            pid += 1
            y += 1
        panels.append(_panel(pid, col * 12, y, title, unit, targets, extra))
        pid += 1
        col += 1
        if col == 2:
            col, y = 0, y + 8
    return {
        "uid": "specgate",
        "title": "specgate: speculative routing",
        "description": "Is speculative decoding paying? Routing decisions, acceptance per engine, "
        "latency by route, each pair's regime and load, engine load.",
        "tags": ["specgate", "vllm", "speculative-decoding"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "10s",
        "time": {"from": "now-30m", "to": "now"},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Prometheus",
                    "type": "datasource",
                    "query": "prometheus",
                    "current": {},
                    "hide": 0,
                },
                {
                    "name": "model",
                    "label": "Model",
                    "type": "query",
                    "datasource": DS,
                    "query": {"query": "label_values(specgate_requests_total, model)", "refId": "model"},
                    "definition": "label_values(specgate_requests_total, model)",
                    "refresh": 2,
                    "includeAll": True,
                    "allValue": ".*",
                    "multi": True,
                    "current": {"selected": True, "text": "All", "value": "$__all"},
                    "hide": 0,
                },
            ]
        },
        "annotations": {"list": []},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="fail if the committed JSON differs")
    args = ap.parse_args()
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run python {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
