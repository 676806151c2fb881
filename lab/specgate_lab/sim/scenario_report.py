"""One scenario's report from every policy's request records: tables, JSON, CSV and a plot.

Shared by ``specgate simulate --scenario`` and ``specgate bench --scenario``. See
:mod:`specgate_lab.sim.analysis` for the definitions (oracle, goodput, worst minute, switch).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from specgate_lab.sim import analysis as an
from specgate_lab.sim.report import pyplot
from specgate_lab.sim.scenarios import Phase

ORACLE = "oracle"
COLUMNS = (
    "policy", "requests", "finished", "mean_tpot_ms", "p99_tpot_ms", "mean_ttft_ms", "p99_ttft_ms",
    "output_tok_s", "goodput_tok_s", "slo_share", "spec_share", "tpot_vs_best_static", "tpot_vs_oracle",
)  # fmt: skip


def _order(policies: Sequence[str]) -> list[str]:
    first = ("adaptive", an.SPEC, an.BASE, ORACLE, "dynamic-sd")
    return [p for p in first if p in policies] + sorted(p for p in policies if p not in first)


def build(
    records: Mapping[str, Sequence[an.Rec]],
    *,
    t0: float,
    t1: float,
    slo: an.Slo,
    margin: float = an.SWITCH_MARGIN,
    window_s: float = an.WINDOW_S,
) -> dict[str, Any]:
    """Metrics of every policy over arrivals in [t0, t1), plus the oracle and adaptive's
    comparisons where the statics (and adaptive) are present; the oracle picks the better
    static per ``window_s`` (a minute; a compressed day compresses it too)."""
    span = t1 - t0
    recs = {p: an.measured(r, t0, t1) for p, r in records.items()}
    rows: dict[str, dict[str, Any]] = {
        p: {"policy": p, **an.summarize(r, span, slo)} for p, r in recs.items()
    }
    minutes = {p: an.window_tpot(r, t0, window_s) for p, r in recs.items()}
    out: dict[str, Any] = {"window_s": window_s, "t0": t0, "t1": t1, "slo": asdict(slo), "margin": margin}
    have_statics = an.SPEC in recs and an.BASE in recs
    if have_statics:
        choice = an.oracle_choice(minutes[an.SPEC], minutes[an.BASE])
        orecs = an.oracle_records(recs[an.SPEC], recs[an.BASE], choice, window_s)
        rows[ORACLE] = {"policy": ORACLE, **an.summarize(orecs, span, slo)}
        minutes[ORACLE] = an.window_tpot(orecs, t0, window_s)
        out["oracle_choice"] = {str(w): c for w, c in sorted(choice.items())}
        best_name = min((an.SPEC, an.BASE), key=lambda p: rows[p]["mean_tpot_ms"])
        best, orc = rows[best_name]["mean_tpot_ms"], rows[ORACLE]["mean_tpot_ms"]
        for r in rows.values():
            r["tpot_vs_best_static"] = r["mean_tpot_ms"] / best
            r["tpot_vs_oracle"] = r["mean_tpot_ms"] / orc
        out["best_static"] = best_name
        if "adaptive" in recs:
            ad = rows["adaptive"]
            worst = an.worst_minute(minutes["adaptive"], minutes[an.SPEC], minutes[an.BASE])
            sw = an.switch_times(
                recs["adaptive"], minutes[an.SPEC], minutes[an.BASE], margin=margin, window_s=window_s
            )
            delays = [s.delay_s for s in sw]
            out["adaptive"] = {
                "vs_best_static": ad["tpot_vs_best_static"],
                "vs_oracle": ad["tpot_vs_oracle"],
                "p99_vs_best_static": ad["p99_tpot_ms"] / rows[best_name]["p99_tpot_ms"],
                "oracle_gain": 1 - orc / best,
                "capture": an.capture(ad["mean_tpot_ms"], best, orc),
                "worst_minute": None if worst is None else worst[0],
                "worst_minute_start_s": None if worst is None else worst[1] * window_s,
                "switches": [asdict(s) for s in sw],
                "max_switch_s": (
                    None if not sw else math.inf if None in delays else max(d or 0.0 for d in delays)
                ),
            }
            if "dynamic-sd" in rows:
                out["adaptive"]["vs_dynamic_sd"] = ad["mean_tpot_ms"] / rows["dynamic-sd"]["mean_tpot_ms"]
    out["rows"] = [rows[p] for p in _order(list(rows))]
    out["minutes"] = {p: {str(w): v for w, v in sorted(m.items())} for p, m in minutes.items()}
    return out


def _f(v: object, nd: int = 2) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return "–" if math.isnan(v) else "never" if math.isinf(v) else f"{v:.{nd}f}"
    return str(v)


def _delay(d: float | None) -> str:
    return "never" if d is None else f"{d:.1f} s"


def markdown(report: Mapping[str, Any], title: str) -> str:
    slo = report["slo"]
    head = [
        "policy", "TPOT mean (ms)", "TPOT p99 (ms)", "TTFT mean (ms)", "TTFT p99 (ms)",
        f"goodput (tok/s, TPOT ≤ {slo['tpot_ms']:g} ms, TTFT ≤ {slo['ttft_ms']:g} ms)", "SLO share",
        "spec share", "÷ best static", "÷ oracle",
    ]  # fmt: skip
    lines = [f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in report["rows"]:
        cells = [
            r["policy"],
            _f(r["mean_tpot_ms"]),
            _f(r["p99_tpot_ms"]),
            _f(r["mean_ttft_ms"], 1),
            _f(r["p99_ttft_ms"], 1),
            _f(r["goodput_tok_s"], 0),
            _f(r["slo_share"]),
            _f(r["spec_share"]),
            _f(r.get("tpot_vs_best_static"), 3),
            _f(r.get("tpot_vs_oracle"), 3),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    ad = report.get("adaptive")
    if ad:
        sw = ", ".join(f"{s['at_s']:.0f} s → {s['to']} ({_delay(s['delay_s'])})" for s in ad["switches"])
        cap = ad["capture"]
        lines += [
            "",
            f"- adaptive ÷ best static ({report['best_static']}): {_f(ad['vs_best_static'], 3)} mean TPOT, "
            f"{_f(ad['p99_vs_best_static'], 3)} p99 TPOT; ÷ oracle {_f(ad['vs_oracle'], 3)}"
            + (f"; ÷ dynamic-sd {_f(ad['vs_dynamic_sd'], 3)}" if "vs_dynamic_sd" in ad else ""),
            f"- oracle gain over the best static: {100 * ad['oracle_gain']:.1f} %; adaptive captured "
            + ("– (no gain)" if cap is None else f"{100 * cap:.0f} %"),
            f"- worst minute: adaptive {_f(ad['worst_minute'], 3)} × the better static "
            f"(window from {_f(ad['worst_minute_start_s'], 0)} s)",
            f"- time to switch (margin {100 * report['margin']:.0f} %): "
            f"{sw or 'no change of the better static'}; max {_f(ad['max_switch_s'], 1)} s",
        ]
    return "\n".join(lines) + "\n"


def write(report: dict[str, Any], meta: dict[str, Any], out: Path, title: str) -> str:
    """results.{json,csv,md} and minutes.csv under ``out``; returns the markdown."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, **report}, indent=1, default=str))
    with (out / "results.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(COLUMNS), extrasaction="ignore")
        w.writeheader()
        w.writerows(report["rows"])
    minutes = report["minutes"]
    pols = list(minutes)
    wins = sorted({int(w) for m in minutes.values() for w in m})
    with (out / "minutes.csv").open("w", newline="") as f:
        cw = csv.writer(f)
        cw.writerow(["window_start_s", *(f"{p}_mean_tpot_ms" for p in pols), "oracle_choice"])
        for wi in wins:
            cw.writerow([wi * report["window_s"], *(minutes[p].get(str(wi), "") for p in pols),
                         report.get("oracle_choice", {}).get(str(wi), "")])  # fmt: skip
    md = markdown(report, title)
    (out / "results.md").write_text(md)
    return md


def plot(
    report: Mapping[str, Any],
    adaptive: Sequence[an.Rec] | None,
    phases: Sequence[Phase],
    path: Path,
    title: str,
    bin_s: float = 10.0,
) -> bool:
    """TPOT per minute of every policy, adaptive's spec share and the offered QPS over time;
    False when plots are not installed."""
    plt = pyplot()
    if plt is None:
        return False

    fig, (ax, ax2, ax3) = plt.subplots(3, 1, figsize=(10, 8.5), sharex=True)
    t0, ws = float(report["t0"]), float(report["window_s"])
    for p, m in report["minutes"].items():
        xs = sorted(int(w) for w in m)
        style = (
            {"lw": 2.4, "zorder": 5}
            if p == "adaptive"
            else {"ls": ":", "lw": 2}
            if p == ORACLE
            else {"lw": 1.3}
        )
        if not xs:
            continue
        end = min((xs[-1] + 1) * ws, float(report["t1"]))
        ys = [m[str(w)] for w in xs]
        ax.step([max(t0, w * ws) for w in xs] + [end], [*ys, ys[-1]], where="post", label=p, **style)
    ax.set_ylabel(f"mean TPOT per {ws:g} s (ms)")
    ax.legend(fontsize=8)
    if adaptive:
        bins: dict[int, list[float]] = {}
        for r in adaptive:
            bins.setdefault(int(r.arrival // bin_s), []).append(1.0 if r.route == "spec" else 0.0)
        xs = sorted(bins)
        ax2.plot([x * bin_s for x in xs], [an.mean(bins[x]) for x in xs], label="adaptive spec share")
        counts = [len(bins[x]) / bin_s for x in xs]
        ax3.plot([x * bin_s for x in xs], counts, alpha=0.5, label=f"arrivals per s ({bin_s:g} s bins)")
    for w, c in report.get("oracle_choice", {}).items():
        if c == an.SPEC:
            ax2.axvspan(max(t0, int(w) * ws), (int(w) + 1) * ws, color="tab:green", alpha=0.12)
    ax2.axhline(0.5, color="grey", lw=0.8)
    ax2.set_ylabel("adaptive: share routed to spec\n(green: spec better that minute)")
    ax2.set_ylim(-0.05, 1.05)
    ts, qs, start = [], [], 0.0
    for ph in phases:
        ts += [start, start + ph.duration_s]
        qs += [ph.start_qps, ph.end_qps]
        start += ph.duration_s
    ax3.plot(ts, qs, color="black", label="offered QPS")
    ax3.set_ylabel("QPS")
    ax3.set_xlabel("arrival time (s)")
    ax3.legend(fontsize=8)
    for a in (ax, ax2, ax3):
        a.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
