"""Compare a real-GPU sweep with the same sweep through the emulator, point by point.

    python3 loadtests/gpu/compare.py REAL_ROWS.jsonl[,MORE.jsonl] EMU_ROWS.jsonl[,...] > compare.md

Per (speculative engine, policy, concurrency): mean TPOT, output tokens/s and the share
routed to the speculative engine, real against emulated, with the relative difference
(emulated / real - 1). Differences beyond 15 % are marked with **bold**.
"""

from __future__ import annotations

import json
import sys
from typing import Any

Key = tuple[str, str, int]
LIMIT = 0.15


def load(paths: str) -> dict[Key, dict[str, Any]]:
    rows: dict[Key, dict[str, Any]] = {}
    for path in paths.split(","):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    r = json.loads(line)
                    spec = "—" if r["policy"] == "always-base" else r["spec_engine"]
                    rows[(spec, r["policy"], int(r["concurrency"]))] = r
    return rows


def rel(emu: float | None, real: float | None) -> float | None:
    if emu is None or real is None or real == 0:
        return None
    return emu / real - 1.0


def fmt_rel(d: float | None) -> str:
    if d is None:
        return "—"
    s = f"{d:+.0%}"
    return f"**{s}**" if abs(d) > LIMIT else s


def fmt(v: Any, nd: int = 1) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def table(real: dict[Key, dict[str, Any]], emu: dict[Key, dict[str, Any]]) -> tuple[str, dict[str, int]]:
    head = (
        "| spec engine | policy | C | TPOT real ms | TPOT emu ms | Δ | tok/s real | tok/s emu | Δ "
        "| spec share real / emu | AL real / emu |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    lines = [head]
    counts = {"points": 0, "tpot_within": 0, "tps_within": 0}
    order = {"always-base": 0, "always-spec": 1, "adaptive": 2}
    for key in sorted(real, key=lambda k: (k[0] != "—", k[0], order.get(k[1], 9), k[2])):
        r = real[key]
        e = emu.get(key)
        if e is None:
            continue
        d_tpot = rel(e["tpot_mean_ms"], r["tpot_mean_ms"])
        d_tps = rel(e["tokens_per_s"], r["tokens_per_s"])
        counts["points"] += 1
        counts["tpot_within"] += d_tpot is not None and abs(d_tpot) <= LIMIT
        counts["tps_within"] += d_tps is not None and abs(d_tps) <= LIMIT
        al_r = (r.get("spec") or {}).get("al_drafted")
        al_e = (e.get("spec") or {}).get("al_drafted")
        cells = [
            key[0],
            key[1],
            str(key[2]),
            fmt(r["tpot_mean_ms"], 2),
            fmt(e["tpot_mean_ms"], 2),
            fmt_rel(d_tpot),
            fmt(r["tokens_per_s"], 0),
            fmt(e["tokens_per_s"], 0),
            fmt_rel(d_tps),
            f"{fmt(r.get('spec_share'), 2)} / {fmt(e.get('spec_share'), 2)}",
            f"{fmt(al_r, 2)} / {fmt(al_e, 2)}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines), counts


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    real, emu = load(argv[1]), load(argv[2])
    text, c = table(real, emu)
    print(text)
    print(
        f"\n{c['points']} points; TPOT within ±15 %: {c['tpot_within']}, "
        f"tokens/s within ±15 %: {c['tps_within']}."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
