"""Sweep results → CSV, JSON, a markdown table and a PNG plot."""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from pathlib import Path

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
        statics = [float(row[p]["mean_tpot_ms"]) for p in policies if p != "adaptive" and p in row]
        ad = row.get("adaptive")
        if ad and statics:
            cells.append(_f(float(ad["mean_tpot_ms"]) / min(statics), 3))
            cells.append(_f(ad["spec_share"]))
        else:
            cells += ["–", "–"]
        cells.append(" / ".join(_f(row[p]["mean_ttft_ms"], 1) if p in row else "–" for p in policies))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[Row], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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


def schedule_markdown(rows: Sequence[Row]) -> str:
    head = [
        "policy",
        "phase start (s)",
        "QPS",
        "TPOT mean (ms)",
        "TPOT p99 (ms)",
        "TTFT mean (ms)",
        "spec share",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [
            str(r["policy"]),
            _f(r.get("phase_start_s", ""), 0),
            _f(r["qps"], 1),
            _f(r["mean_tpot_ms"]),
            _f(r["p99_tpot_ms"]),
            _f(r["mean_ttft_ms"], 1),
            _f(r["spec_share"]),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def timeline_plot(results: Sequence[object], path: Path, title: str, bin_s: float = 10.0) -> None:
    """Mean TPOT of requests by arrival time (bins), one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for res in results:
        recs = res.records  # type: ignore[attr-defined]
        name = res.config.policy  # type: ignore[attr-defined]
        bins: dict[int, list[float]] = {}
        spec: dict[int, list[float]] = {}
        for r in recs:
            b = int(r.arrival // bin_s)
            spec.setdefault(b, []).append(1.0 if r.route == "spec" else 0.0)
            if r.tpot_s is not None:
                bins.setdefault(b, []).append(r.tpot_s * 1e3)
        xs = sorted(bins)
        ax.plot([x * bin_s for x in xs], [sum(bins[x]) / len(bins[x]) for x in xs], marker=".", label=name)
        xs2 = sorted(spec)
        ax2.plot([x * bin_s for x in xs2], [sum(spec[x]) / len(spec[x]) for x in xs2], label=name)
    ax.set_ylabel(f"mean TPOT (ms), {bin_s:g} s bins")
    ax2.set_ylabel("share routed to spec")
    ax2.set_xlabel("arrival time (s)")
    ax.legend()
    ax.grid(True, alpha=0.3)
    ax2.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
