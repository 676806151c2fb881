#!/usr/bin/env python3
"""Render one panel of the specgate Grafana dashboard to a PNG, from Prometheus data.

Either against a Prometheus you run (it must scrape the gateway and the engines with the
labels of deploy/prometheus/prometheus.yml)::

    python deploy/grafana/render_panel.py --prometheus http://127.0.0.1:9090 \\
        --panel "Route share" --minutes 30 --out route-share.png

or self-contained, GPU-free: ``--lab`` starts an emulated engine pair, the gateway and a
real Prometheus (the ``prometheus`` binary) on loopback, streams a mixed load through the
gateway for ``--load-seconds``, then renders::

    python deploy/grafana/render_panel.py --lab --load-seconds 60 \\
        --panel "Time per output token p50 / p99 by route" --out docs/panel-tpot-by-route.png

The panel's queries are the dashboard's own (``dashboards/specgate.json``), with
``$__rate_interval`` set to ``--rate-interval`` and ``$model`` to all models.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

HERE = Path(__file__).resolve().parent
DASHBOARD = HERE / "dashboards" / "specgate.json"
REPO = HERE.parents[1]
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"

Series = tuple[str, list[float], list[float]]


def find_panel(title: str) -> dict[str, Any]:
    dash = json.loads(DASHBOARD.read_text())
    panels: list[dict[str, Any]] = [p for p in dash["panels"] if p.get("type") != "row"]
    for p in panels:
        if p["title"].lower() == title.lower():
            return p
    names = "\n  ".join(p["title"] for p in panels)
    raise SystemExit(f"no panel titled {title!r}; panels:\n  {names}")


def legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt).strip() or json.dumps(
        labels
    )


async def fetch(
    prom: str, panel: dict[str, Any], start: float, end: float, step: float, rate: str
) -> list[Series]:
    out: list[Series] = []
    async with aiohttp.ClientSession() as s:
        for t in panel["targets"]:
            expr = t["expr"].replace("$__rate_interval", rate).replace("$model", ".*")
            params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
            async with s.get(f"{prom}/api/v1/query_range", params=params) as r:
                body = await r.json()
            if body.get("status") != "success":
                raise SystemExit(f"query failed: {expr}: {body.get('error')}")
            for res in body["data"]["result"]:
                xs = [float(v[0]) - start for v in res["values"]]
                ys = [float(v[1]) for v in res["values"]]
                out.append((legend(t.get("legendFormat", ""), res["metric"]), xs, ys))
    return out


def plot(panel: dict[str, Any], series: list[Series], out: Path, subtitle: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "none")
    scale, ylabel = {"s": (1000.0, "ms"), "percentunit": (100.0, "%"), "none": (1.0, "")}.get(
        unit, (1.0, unit)
    )
    fig, ax = plt.subplots(figsize=(10, 4.8), dpi=110)
    for name, xs, ys in sorted(series):
        ax.plot(xs, [y * scale for y in ys], label=name, linewidth=1.6)
    ax.set_title(f"{panel['title']}\n{subtitle}", fontsize=11)
    ax.set_xlabel("seconds")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    if series:
        ax.legend(fontsize=8, loc="best")
    else:
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


async def with_lab(args: argparse.Namespace, panel: dict[str, Any]) -> tuple[list[Series], str]:
    from specgate_lab.promlab import run_load, start_lab

    with tempfile.TemporaryDirectory(prefix="specgate-lab-") as tmp:
        lab = await start_lab(Path(tmp), rule_files=[str(ALERTS)])
        try:
            start = time.time()
            stop = asyncio.Event()
            load = asyncio.create_task(run_load(lab.gateway_url, stop, concurrency=args.concurrency))
            await asyncio.sleep(args.load_seconds)
            stop.set()
            sent = await load
            await asyncio.sleep(2.0)  # one more scrape
            series = await fetch(lab.prometheus_url, panel, start, time.time(), args.step, args.rate_interval)
        finally:
            await lab.stop()
    sub = (
        f"emulated H200 pair, {sent} streamed requests over {args.load_seconds:.0f} s "
        f"(mixed forced/auto routes), rate window {args.rate_interval}"
    )
    return series, sub


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prometheus", help="base URL of a Prometheus with specgate data")
    src.add_argument("--lab", action="store_true", help="start emulated engines + gateway + Prometheus here")
    ap.add_argument("--panel", default="Time per output token p50 / p99 by route", help="panel title")
    ap.add_argument("--out", type=Path, default=Path("panel.png"), help="PNG to write")
    ap.add_argument("--minutes", type=float, default=30.0, help="--prometheus: how far back")
    ap.add_argument("--step", type=float, default=1.0, help="range query step, seconds")
    ap.add_argument("--rate-interval", default="10s", help="value of $__rate_interval")
    ap.add_argument("--load-seconds", type=float, default=60.0, help="--lab: load duration")
    ap.add_argument("--concurrency", type=int, default=4, help="--lab: concurrent streams")
    args = ap.parse_args()
    panel = find_panel(args.panel)
    if args.lab:
        series, sub = asyncio.run(with_lab(args, panel))
    else:
        end = time.time()
        series = asyncio.run(
            fetch(
                args.prometheus.rstrip("/"),
                panel,
                end - args.minutes * 60,
                end,
                args.step,
                args.rate_interval,
            )
        )
        sub = f"{args.prometheus}, last {args.minutes:g} min"
    plot(panel, series, args.out, sub)
    print(f"wrote {args.out} ({len(series)} series)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
