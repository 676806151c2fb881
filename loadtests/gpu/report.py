"""Tables of a real-GPU (or emulated) sweep: per speculative engine and concurrency, mean
TPOT and output tokens/s of always-plain, always-spec and adaptive, and adaptive's share
of requests sent to the speculative engine.

    python3 loadtests/gpu/report.py results/gpu/real/rows.jsonl
    python3 loadtests/gpu/report.py results/gpu/real/rows.jsonl \
        --by-temperature results/gpu/real/requests.csv.gz
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import statistics
from collections import defaultdict
from typing import Any


def load(paths: list[str]) -> list[dict[str, Any]]:
    rows = []
    for p in paths:
        with open(p, encoding="utf-8") as fh:
            rows += [json.loads(line) for line in fh if line.strip()]
    return rows


def _f(v: Any, nd: int = 2) -> str:
    return "—" if v is None else f"{v:.{nd}f}"


def main_table(rows: list[dict[str, Any]]) -> str:
    base = {r["concurrency"]: r for r in rows if r["policy"] == "always-base"}
    by: dict[tuple[str, str, int], dict[str, Any]] = {
        (r["spec_engine"], r["policy"], r["concurrency"]): r for r in rows if r["policy"] != "always-base"
    }
    engines = sorted(
        {k[0] for k in by}, key=lambda e: ("ngram", "eagle3-hi", "eagle3-lo", "draft-hi").index(e)
    )
    out = [
        "| spec engine (AL) | C | TPOT ms plain / spec / adaptive | tok/s plain / spec / adaptive "
        "| adaptive → spec | spec speed-up |",
        "|---|---:|---|---|---:|---:|",
    ]
    for e in engines:
        for c in sorted({k[2] for k in by if k[0] == e}):
            b, s, a = base.get(c), by.get((e, "always-spec", c)), by.get((e, "adaptive", c))
            if b is None or s is None or a is None:
                continue
            al = (s.get("spec") or {}).get("al_drafted")
            sp = b["tpot_mean_ms"] / s["tpot_mean_ms"] if s["tpot_mean_ms"] else None
            out.append(
                f"| {e} ({_f(al)}) | {c} | {_f(b['tpot_mean_ms'])} / {_f(s['tpot_mean_ms'])} / "
                f"{_f(a['tpot_mean_ms'])} | {b['tokens_per_s']:.0f} / {s['tokens_per_s']:.0f} / "
                f"{a['tokens_per_s']:.0f} | {a['spec_share']:.0%} | {_f(sp)}× |"
            )
    return "\n".join(out)


def by_temperature(csv_path: str, engine: str = "ngram") -> str:
    """Mean client TPOT of greedy (T=0) and sampled (T>0) requests, per policy and concurrency."""
    opener = gzip.open if csv_path.endswith(".gz") else open
    acc: dict[tuple[str, int, str], list[float]] = defaultdict(list)
    with opener(csv_path, "rt", encoding="utf-8") as fh:
        for r in csv.DictReader(fh):
            if r["ok"] != "True" or not r["tpot"]:
                continue
            name, conc = r["point"].rsplit("-c", 1)
            if name.endswith("-always-base"):
                policy = "always-base"  # the plain engine alone, whichever pair it ran with
            elif name.startswith(engine + "-"):
                policy = name[len(engine) + 1 :]
            else:
                continue
            t = "T=0" if float(r["temperature"]) == 0 else "T>0"
            acc[(policy, int(conc), t)].append(1000 * float(r["tpot"]))
    out = [
        f"| C | plain T=0 / T>0 | {engine} T=0 / T>0 | adaptive T=0 / T>0 |",
        "|---:|---|---|---|",
    ]
    for c in sorted({k[1] for k in acc}):

        def m(policy: str, t: str, c: int = c) -> str:
            v = acc.get((policy, c, t))
            return _f(statistics.fmean(v)) if v else "—"

        out.append(
            f"| {c} | {m('always-base', 'T=0')} / {m('always-base', 'T>0')} "
            f"| {m('always-spec', 'T=0')} / {m('always-spec', 'T>0')} "
            f"| {m('adaptive', 'T=0')} / {m('adaptive', 'T>0')} |"
        )
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("rows", nargs="+")
    p.add_argument("--by-temperature", metavar="REQUESTS_CSV")
    a = p.parse_args()
    print(main_table(load(a.rows)))
    if a.by_temperature:
        print()
        print(by_temperature(a.by_temperature))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
