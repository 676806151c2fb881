"""The table of docs/epp.md: adaptive through specgate's proxy and through Envoy + the EPP,
each set against the same statics (the proxy run's always-spec and always-base), from the
two runs' requests.csv (the bench side), with the scenario report's own definitions.

    python loadtests/results/bench-scenarios/epp-temp-shift/table.py
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from specgate_lab.sim import analysis as an
from specgate_lab.sim import scenario_report

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True, slots=True)
class Rec:
    arrival: float
    route: str
    output_tokens: int
    ttft_s: float | None
    tpot_s: float | None
    finished_at: float | None  # requests.csv has no end time: the arrival stands in for done ones


def bench_records(path: Path) -> dict[str, list[Rec]]:
    out: dict[str, list[Rec]] = {}
    with path.open(encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            if row["side"] != "bench":
                continue
            at = float(row["arrival_s"])
            ttft = float(row["ttft_ms"]) / 1e3 if row["ttft_ms"] else None
            tpot = float(row["tpot_ms"]) / 1e3 if row["tpot_ms"] else None
            rec = Rec(
                at, row["route"], int(row["output_tokens"]), ttft, tpot, at if ttft is not None else None
            )
            out.setdefault(row["policy"], []).append(rec)
    return out


def main() -> None:
    proxy = bench_records(HERE / "proxy" / "requests.csv")
    epp = bench_records(HERE / "envoy-epp" / "requests.csv")
    proxy_report = json.loads((HERE / "proxy" / "results.json").read_text())
    t0, t1 = proxy_report["t0"], proxy_report["t1"]
    slo = an.Slo(**proxy_report["slo"])
    statics = {p: proxy[p] for p in (an.SPEC, an.BASE)}
    reports = {
        via: scenario_report.build({"adaptive": recs["adaptive"], **statics}, t0=t0, t1=t1, slo=slo)
        for via, recs in (("proxy", proxy), ("envoy-epp", epp))
    }
    rows = {via: {r["policy"]: r for r in rep["rows"]} for via, rep in reports.items()}
    print(
        "| policy | via | TPOT mean (ms) | TPOT p99 (ms) | TTFT mean (ms) | spec share | "
        "÷ best static (mean TPOT) | time to switch | ÷ adaptive via proxy (mean / p99 TPOT) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for via in ("proxy", "envoy-epp"):
        r, ad = rows[via]["adaptive"], reports[via]["adaptive"]
        sw = ", ".join(
            f"{s['at_s']:.0f} s → {s['to']}: "
            + ("never" if s["delay_s"] is None else f"{s['delay_s']:.1f} s")
            for s in ad["switches"]
        )
        ref = rows["proxy"]["adaptive"]
        ratio = f"{r['mean_tpot_ms'] / ref['mean_tpot_ms']:.3f} / {r['p99_tpot_ms'] / ref['p99_tpot_ms']:.3f}"
        print(
            f"| adaptive | {via} | {r['mean_tpot_ms']:.2f} | {r['p99_tpot_ms']:.2f} "
            f"| {r['mean_ttft_ms']:.1f} | {r['spec_share']:.2f} | {ad['vs_best_static']:.3f} "
            f"| {sw} | {ratio} |"
        )
    for p in (an.SPEC, an.BASE):
        r = rows["proxy"][p]
        print(
            f"| {p} | proxy | {r['mean_tpot_ms']:.2f} | {r['p99_tpot_ms']:.2f} | {r['mean_ttft_ms']:.1f} "
            f"| {r['spec_share']:.2f} | {r['tpot_vs_best_static']:.3f} | – | – |"
        )
    o = rows["proxy"][scenario_report.ORACLE]
    print(
        f"| oracle (per minute, of the statics) | – | {o['mean_tpot_ms']:.2f} | {o['p99_tpot_ms']:.2f} "
        f"| {o['mean_ttft_ms']:.1f} | {o['spec_share']:.2f} | {o['tpot_vs_best_static']:.3f} | – | – |"
    )
    for via in ("proxy", "envoy-epp"):
        ad = reports[via]["adaptive"]
        cap = "–" if ad["capture"] is None else f"{100 * ad['capture']:.0f} %"
        print(
            f"\n- adaptive via {via}: ÷ oracle {ad['vs_oracle']:.3f}, p99 ÷ best static "
            f"{ad['p99_vs_best_static']:.3f}, captured {cap} of the oracle's gain, worst minute "
            f"{ad['worst_minute']:.3f} × the better static"
        )


if __name__ == "__main__":
    main()
