"""Benchmark outputs: CSV, JSON, a markdown table and a PNG plot."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Sequence
from typing import Any

from specgate_lab.sim.report import pyplot

COLUMNS: tuple[tuple[str, str, str], ...] = (
    # (key, markdown header, format)
    ("policy", "policy", "s"),
    ("qps", "offered QPS", "g"),
    ("achieved_qps", "achieved QPS", ".2f"),
    ("requests", "requests", "d"),
    ("failures", "failed", "d"),
    ("unfinished", "unfinished", "d"),
    ("tpot_mean_ms", "TPOT mean ms", ".1f"),
    ("tpot_p99_ms", "TPOT p99 ms", ".1f"),
    ("ttft_mean_ms", "TTFT mean ms", ".0f"),
    ("ttft_p99_ms", "TTFT p99 ms", ".0f"),
    ("throughput_tps", "output tok/s", ".0f"),
    ("goodput_rps", "goodput req/s", ".2f"),
    ("spec_share", "to spec", ".0%"),
)


def _fmt(v: Any, f: str) -> str:
    if v is None:
        return "–"
    try:
        return format(v, f)
    except (TypeError, ValueError):
        return str(v)


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    head = "| " + " | ".join(h for _, h, _ in COLUMNS) + " |"
    sep = "|" + "|".join("---" if f == "s" else "---:" for _, _, f in COLUMNS) + "|"
    body = ["| " + " | ".join(_fmt(r.get(k), f) for k, _, f in COLUMNS) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def write_csv(rows: Sequence[dict[str, Any]], path: str) -> None:
    keys = [k for k, _, _ in COLUMNS] + sorted({k for r in rows for k in r} - {k for k, _, _ in COLUMNS})
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (json.dumps(v) if isinstance(v, dict) else v) for k, v in r.items()})


def write_json(meta: dict[str, Any], rows: Sequence[dict[str, Any]], path: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"meta": meta, "results": list(rows)}, fh, indent=2)
        fh.write("\n")


def plot(rows: Sequence[dict[str, Any]], path: str, title: str) -> bool:
    """TPOT and throughput against QPS per policy into ``path``; False when plots are not installed."""
    plt = pyplot()
    if plt is None:
        return False

    policies = list(dict.fromkeys(r["policy"] for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    panels = (
        ("tpot_mean_ms", "mean TPOT (ms, emulated)"),
        ("tpot_p99_ms", "p99 TPOT (ms, emulated)"),
        ("throughput_tps", "output tokens/s (emulated)"),
    )
    for ax, (key, label) in zip(axes, panels, strict=True):
        for pol in policies:
            pts = sorted(
                (r["qps"], r.get(key)) for r in rows if r["policy"] == pol and r.get(key) is not None
            )
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=pol)
        ax.set_xlabel("offered QPS")
        ax.set_ylabel(label)
        ax.set_xscale("log")
        ax.grid(True, alpha=0.3)
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_all(out_dir: str, meta: dict[str, Any], rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = {
        "csv": os.path.join(out_dir, "results.csv"),
        "json": os.path.join(out_dir, "results.json"),
        "md": os.path.join(out_dir, "results.md"),
        "png": os.path.join(out_dir, "tpot_throughput_vs_qps.png"),
    }
    write_csv(rows, paths["csv"])
    write_json(meta, rows, paths["json"])
    with open(paths["md"], "w", encoding="utf-8") as fh:
        fh.write(markdown_table(rows) + "\n")
    if not plot(rows, paths["png"], str(meta.get("title", "specgate bench"))):
        del paths["png"]
    return paths


README_BEGIN = "<!-- section:bench -->"
README_END = "<!-- /section:bench -->"


def update_readme(path: str, body: str) -> bool:
    """Replace the text between the bench markers of ``path``; False when they are missing."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    i, j = text.find(README_BEGIN), text.find(README_END)
    if i < 0 or j < i:
        return False
    new = text[: i + len(README_BEGIN)] + "\n" + body.rstrip() + "\n" + text[j:]
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(new)
    return True


def readme_section(
    meta: dict[str, Any], rows: list[dict[str, Any]], png: str, kit: str = "loadtests/README.md"
) -> str:
    return "\n".join(
        [
            "## Policy benchmark (emulated H200 pair, real sockets)",
            "",
            f"`{meta['command']}` — {meta['date']}"
            + (f" (code `{meta['code_version']}`)" if meta.get("code_version") else "")
            + f", {meta['mix_desc']}, "
            f"temperatures `{meta['temperature']}`, "
            f"≥ {meta['duration_s']:g} s measured per point (≥ {meta['min_requests']} expected requests) "
            f"after {meta['warmup_s']:g} s warm-up; "
            "times are emulated (the emulator ran `time_scale` times slower than the wall clock).",
            "",
            markdown_table(rows),
            "",
            f"![TPOT and throughput vs QPS]({png})",
            "",
            "Columns: TPOT = (e2e − TTFT)/(tokens − 1) per request; output tok/s delivered inside the "
            "window; goodput = requests/s meeting TPOT ≤ "
            f"{meta['tpot_slo_ms']:g} ms and TTFT ≤ {meta['ttft_slo_ms']:g} ms; per-kind route shares and "
            "decision reasons are in `results.json`. To load-test a deployment yourself: the Locust kit "
            "(`loadtests/locustfile.py`) and vLLM's own client (`loadtests/vllm_bench.sh`; a recorded run "
            "through the gateway is in `loadtests/results/vllm-bench-emulated.txt`); see "
            f"[loadtests/README.md]({kit}). Notes on a run (per-kind TPOT, the cross-check "
            "against the socket-free `specgate simulate`) sit beside its results.",
        ]
    )
