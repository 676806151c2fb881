"""Combine rounds of ``day.py`` (one output folder each, ``--round K`` rotating the order):
per round each policy's mean TPOT and adaptive's ratios, then the ratios over rounds.

    python3 loadtests/gpu/day_rounds.py results/gpu/round6/dayN-r0 results/gpu/round6/dayN-r1 ...

A day is one sample per policy per round; the spread of a ratio over rounds, and the A/A
(``P#2`` ÷ ``P``) where a round ran a policy twice, show what a difference must exceed to be
more than the order and the day's noise. Where the rounds ran a ratio's two policies in both
orders, the ratio is also given per order and balanced (the geometric mean of the two orders'
means), so that rounds unequal in number per order do not carry a slot effect into it. Each
request ran in every slot (the same arrivals): adaptive's twins are also compared by the
route adaptive gave them, the ones it left on plain showing the slots' own difference.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import sys
from pathlib import Path
from typing import Any

RATIOS = (
    ("adaptive ÷ always-spec", "adaptive", "always-spec"),
    ("adaptive ÷ always-base", "adaptive", "always-base"),
)


def load(folder: Path) -> dict[str, Any]:
    doc = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    tpot = {r["policy"]: float(r["mean_tpot_ms"]) for r in doc["rows"] if r["policy"] != "oracle"}
    meta = doc.get("meta", {})
    return {
        "folder": folder.name,
        "path": folder,
        "round": meta.get("round", 0),
        "order": meta.get("order", []),
        "tpot": tpot,
        "t0": float(doc.get("t0", 0.0)),
    }


def twins(day: dict[str, Any], a: str = "adaptive", b: str = "always-base") -> dict[str, tuple[int, float]]:
    """The same arrivals through slots ``a`` and ``b`` (the folder's requests.csv[.gz]),
    grouped by the route ``a`` gave them: per route, how many and Σ TPOT in ``a`` ÷ Σ TPOT in
    ``b``. Where ``a`` ran its twins on the engine ``b`` pins, the ratio is the two slots'
    own difference; on the other engine, the routing's effect times that difference."""
    folder: Path = day["path"]
    path = folder / "requests.csv.gz"
    if not path.exists():
        path = folder / "requests.csv"
    if not path.exists():
        return {}
    opener = gzip.open if path.suffix == ".gz" else open
    tpot: dict[str, dict[str, tuple[str, float]]] = {a: {}, b: {}}
    with opener(path, "rt", encoding="utf-8", newline="") as fh:
        for r in csv.DictReader(fh):
            if r["policy"] in tpot and r["tpot_s"] and float(r["arrival"]) >= day["t0"]:
                tpot[r["policy"]][r["arrival"]] = (r["route"], float(r["tpot_s"]))
    sums: dict[str, list[float]] = {}
    for arrival, (route, x) in tpot[a].items():
        if arrival in tpot[b]:
            acc = sums.setdefault(route, [0.0, 0.0, 0.0])
            acc[0] += 1
            acc[1] += x
            acc[2] += tpot[b][arrival][1]
    return {route: (int(n), sa / sb) for route, (n, sa, sb) in sorted(sums.items()) if sb > 0}


def pairs(days: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """The ratios these rounds can give: adaptive's against each static, and an A/A for
    each policy a round ran twice (``P#2`` ÷ ``P``)."""
    twice = sorted({p for d in days for p in d["tpot"] if p.endswith("#2")})
    return [*RATIOS, *((f"A/A: {p} ÷ {p[:-2]}", p, p[:-2]) for p in twice)]


def ratios(day: dict[str, Any], names: list[tuple[str, str, str]]) -> dict[str, float]:
    t = day["tpot"]
    return {name: t[a] / t[b] for name, a, b in names if a in t and b in t and t[b] > 0}


def _gm(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


# Student's t, two-sided 95 %, by degrees of freedom (rounds - 1); between entries the
# lower one's (wider). Not specgate_lab.bench.windows.paired_ratio's bootstrap: over the 2-4
# rounds a GPU session holds, resampling them gives little more than their range.
_T95 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    15: 2.131,
    20: 2.086,
    30: 2.042,
    60: 2.000,
    120: 1.980,
}


def t_interval(xs: list[float]) -> tuple[float, float] | None:
    """The 95 % interval of the geometric mean over rounds (t on the logs: each round one
    sample of the ratio), or None with fewer than two rounds."""
    n = len(xs)
    if n < 2:
        return None
    logs = [math.log(x) for x in xs]
    mean = sum(logs) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in logs) / (n - 1))
    half = _T95[max(k for k in _T95 if k <= n - 1)] * sd / math.sqrt(n)
    return math.exp(mean - half), math.exp(mean + half)


def combine(days: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per ratio over the rounds: geometric mean, min, max, rounds, the 95 % t-interval;
    where both orders ran, the mean of the rounds with the numerator first, of those with
    it later, and balanced."""
    names = pairs(days)
    out: dict[str, dict[str, float]] = {}
    for name, a, b in names:
        got = [(r[name], d) for d in days if name in (r := ratios(d, [(name, a, b)]))]
        if not got:
            continue
        xs = [x for x, _ in got]
        c = {"mean": _gm(xs), "min": min(xs), "max": max(xs), "rounds": float(len(xs))}
        if (ci := t_interval(xs)) is not None:
            c |= {"ci_lo": ci[0], "ci_hi": ci[1]}
        first = [x for x, d in got if a in d["order"] and d["order"].index(a) < d["order"].index(b)]
        later = [x for x, d in got if a in d["order"] and d["order"].index(a) > d["order"].index(b)]
        if first and later and not name.startswith("A/A"):
            c |= {"first": _gm(first), "later": _gm(later), "balanced": math.sqrt(_gm(first) * _gm(later))}
        out[name] = c
    return out


def markdown(days: list[dict[str, Any]]) -> str:
    policies = sorted({p for d in days for p in d["tpot"]})
    names = pairs(days)
    lines = [
        "| round | order | " + " | ".join(policies) + " | " + " | ".join(n for n, _, _ in names) + " |",
        "|---|---|" + "---|" * (len(policies) + len(names)),
    ]
    for d in sorted(days, key=lambda d: d["round"]):
        r = ratios(d, names)
        cells = [f"{d['tpot'][p]:.2f}" if p in d["tpot"] else "–" for p in policies]
        cells += [f"{r[n]:.3f}" if n in r else "–" for n, _, _ in names]
        lines.append(f"| {d['round']} | {', '.join(d['order'])} | " + " | ".join(cells) + " |")
    lines.append("")
    for name, c in combine(days).items():
        line = f"- {name}: {c['mean']:.3f} over {int(c['rounds'])} round(s) [{c['min']:.3f}, {c['max']:.3f}]"
        if "ci_lo" in c:
            line += f", 95 % t-interval [{c['ci_lo']:.3f}, {c['ci_hi']:.3f}]"
        if "balanced" in c:
            line += f"; first {c['first']:.3f}, later {c['later']:.3f}, balanced {c['balanced']:.3f}"
        lines.append(line)
    for d in sorted(days, key=lambda d: d["round"]):
        tw = twins(d)
        if tw:
            cells = ", ".join(f"on {route} {ratio:.3f} ({n})" for route, (n, ratio) in tw.items())
            lines.append(
                f"- {d['folder']}: adaptive ÷ always-base over twin requests, by adaptive's route: {cells}"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    print(markdown([load(Path(a)) for a in argv]), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
