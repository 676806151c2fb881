"""Sweep results → CSV, JSON, a markdown table and a PNG plot."""

from __future__ import annotations

import csv
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gateway.routing.factory import ADAPTIVE, STATIC_BASELINES

COLUMNS = (
    "policy",
    "qps",
    "requests",
    "finished",
    "mean_tpot_ms",
    "p99_tpot_ms",
    "mean_ttft_ms",
    "p99_ttft_ms",
    "output_tok_s",
    "spec_share",
    "probe_share",
)
Row = dict[str, float | int | str]


def write_csv(rows: Sequence[Row], path: Path, extra: tuple[str, ...] = ()) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*extra, *COLUMNS], extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(r)


def write_json(rows: Sequence[Row], meta: dict[str, object], path: Path) -> None:
    path.write_text(json.dumps({"meta": meta, "results": list(rows)}, indent=1, default=str))


def _f(v: object, nd: int = 2) -> str:
    if isinstance(v, float):
        return "–" if math.isnan(v) else f"{v:.{nd}f}"
    return str(v)


# rows that are not a static setup: the fleet's oracle (a search) and one regime for all pairs
_NOT_STATIC = frozenset({ADAPTIVE, "oracle", "one-regime"})


def markdown(rows: Sequence[Row]) -> str:
    """One line per QPS: each policy's mean/p99 TPOT, and adaptive's ratio to the best static."""
    by: dict[float, dict[str, Row]] = {}
    for r in rows:
        by.setdefault(float(r["qps"]), {})[str(r["policy"])] = r
    policies = sorted({str(r["policy"]) for r in rows}, key=lambda p: (p != "adaptive", p))
    head = ["QPS"]
    for p in policies:
        head += [f"{p} TPOT mean / p99 (ms)"]
    head += [
        "adaptive ÷ best static (mean TPOT)",
        "adaptive spec share",
        "TTFT mean (ms) " + " / ".join(policies),
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for qps in sorted(by):
        row = by[qps]
        cells = [_f(qps, 1)]
        for p in policies:
            pr = row.get(p)
            cells.append(f"{_f(pr['mean_tpot_ms'])} / {_f(pr['p99_tpot_ms'])}" if pr else "–")
        statics = [float(row[p]["mean_tpot_ms"]) for p in policies if p not in _NOT_STATIC and p in row]
        ad = row.get("adaptive")
        if ad and statics:
            cells.append(_f(float(ad["mean_tpot_ms"]) / min(statics), 3))
            cells.append(_f(ad["spec_share"]))
        else:
            cells += ["–", "–"]
        cells.append(" / ".join(_f(row[p]["mean_ttft_ms"], 1) if p in row else "–" for p in policies))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


PLOTS_EXTRA = "pip install 'specgate-lab[plots]'"


def pyplot() -> Any | None:
    """matplotlib's pyplot on its file backend, or None when matplotlib is not installed
    (the lab without its plots extra): plots are optional, the results never depend on them, so the
    caller skips its plot and this says once, on stderr, which extra draws it."""
    try:
        import matplotlib
    except ImportError:
        print(f"specgate: no plot drawn: matplotlib is not installed ({PLOTS_EXTRA})", file=sys.stderr)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(rows: Sequence[Row], path: Path, title: str) -> bool:
    """Draw the sweep's panels into ``path``; False when plots are not installed."""
    plt = pyplot()
    if plt is None:
        return False

    policies = sorted({str(r["policy"]) for r in rows}, key=lambda p: (p != "adaptive", p))
    panels = (
        ("mean_tpot_ms", "mean TPOT (ms)"),
        ("p99_tpot_ms", "p99 TPOT (ms)"),
        ("mean_ttft_ms", "mean TTFT (ms)"),
        ("output_tok_s", "output tokens/s"),
        ("spec_share", "share routed to spec"),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6))
    for ax, (key, label) in zip(axes, panels, strict=True):
        for p in policies:
            pts = sorted((float(r["qps"]), float(r[key])) for r in rows if r["policy"] == p)
            style = {"ls": "--", "lw": 2.2, "zorder": 5} if p == "adaptive" else {"lw": 1.4}
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=p, **style)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("QPS")
        ax.set_title(label)
        ax.grid(True, alpha=0.3)
        ys = [float(r[key]) for r in rows]
        if key == "mean_ttft_ms" and any(y > 0 for y in ys if not math.isnan(y)):
            ax.set_yscale("log")
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def seed_ratios(rows: Sequence[Row]) -> str:
    """Adaptive's mean TPOT ÷ the better static's, per QPS point and seed, and the max."""
    by: dict[tuple[float, int], dict[str, float]] = {}
    for r in rows:
        by.setdefault((float(r["qps"]), int(r["seed"])), {})[str(r["policy"])] = float(r["mean_tpot_ms"])
    seeds = sorted({s for _, s in by})
    head = ["QPS", *(f"seed {s}" for s in seeds), "max"]
    lines = [
        "adaptive ÷ better static (mean TPOT), per seed",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    overall: list[float] = []
    for qps in sorted({q for q, _ in by}):
        ratios = []
        for s in seeds:
            pt = by.get((qps, s), {})
            statics = [v for p, v in pt.items() if p in STATIC_BASELINES]
            ratios.append(pt[ADAPTIVE] / min(statics) if ADAPTIVE in pt and statics else math.nan)
        ok = [x for x in ratios if not math.isnan(x)]
        overall += ok
        lines.append(
            "| "
            + " | ".join([_f(qps, 1), *(_f(x, 3) for x in ratios), _f(max(ok) if ok else math.nan, 3)])
            + " |"
        )
    lines.append("")
    lines.append(f"max over all points and seeds: {_f(max(overall) if overall else math.nan, 3)}")
    return "\n".join(lines) + "\n"
