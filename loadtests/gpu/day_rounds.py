"""Combine rounds of ``day.py`` (one output folder each, ``--round K`` rotating the order):
per round each policy's mean TPOT and adaptive's ratios, then the ratios over rounds.

    python3 loadtests/gpu/day_rounds.py results/gpu/round6/dayN-r0 results/gpu/round6/dayN-r1 ...

A day is one sample per policy per round; the spread of a ratio over rounds, and the A/A
(``adaptive#2`` ÷ ``adaptive``) where a round ran adaptive twice, show what a difference
must exceed to be more than the order and the day's noise.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

RATIOS = (
    ("adaptive ÷ always-spec", "adaptive", "always-spec"),
    ("adaptive ÷ always-base", "adaptive", "always-base"),
    ("A/A: adaptive#2 ÷ adaptive", "adaptive#2", "adaptive"),
)


def load(folder: Path) -> dict[str, Any]:
    doc = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    tpot = {r["policy"]: float(r["mean_tpot_ms"]) for r in doc["rows"] if r["policy"] != "oracle"}
    meta = doc.get("meta", {})
    return {
        "folder": folder.name,
        "round": meta.get("round", 0),
        "order": meta.get("order", []),
        "tpot": tpot,
    }


def ratios(day: dict[str, Any]) -> dict[str, float]:
    t = day["tpot"]
    return {name: t[a] / t[b] for name, a, b in RATIOS if a in t and b in t and t[b] > 0}


def combine(days: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per ratio over the rounds: geometric mean, min, max, rounds."""
    out: dict[str, dict[str, float]] = {}
    for name, _, _ in RATIOS:
        xs = [r[name] for r in map(ratios, days) if name in r]
        if xs:
            gm = math.exp(sum(math.log(x) for x in xs) / len(xs))
            out[name] = {"mean": gm, "min": min(xs), "max": max(xs), "rounds": float(len(xs))}
    return out


def markdown(days: list[dict[str, Any]]) -> str:
    policies = sorted({p for d in days for p in d["tpot"]})
    lines = [
        "| round | order | " + " | ".join(policies) + " | " + " | ".join(n for n, _, _ in RATIOS) + " |",
        "|---|---|" + "---|" * (len(policies) + len(RATIOS)),
    ]
    for d in sorted(days, key=lambda d: d["round"]):
        r = ratios(d)
        cells = [f"{d['tpot'][p]:.2f}" if p in d["tpot"] else "–" for p in policies]
        cells += [f"{r[n]:.3f}" if n in r else "–" for n, _, _ in RATIOS]
        lines.append(f"| {d['round']} | {', '.join(d['order'])} | " + " | ".join(cells) + " |")
    lines.append("")
    for name, c in combine(days).items():
        lines.append(
            f"- {name}: {c['mean']:.3f} over {int(c['rounds'])} round(s) [{c['min']:.3f}, {c['max']:.3f}]"
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
