"""Policies compared in interleaved windows, with intervals over windows, not requests.

On a shared, warm machine the noise between two measuring windows is larger than what
per-request statistics show: in the first real-GPU round, two policies that routed every
request identically read 0.82-1.54 of each other, window to window. So policies are
measured in short windows taken in turn on the same engines (A B C A' …, one *round*
after another), and compared round by round: the ratio of A's window to B's in the same
round, whose drift both share. The interval is a bootstrap over rounds. A slot that
repeats a policy in the same round (A and A') gives the A/A comparison: the noise a
difference must clear to be believed.

Pure functions of the windows' requests and figures; the load generator that produces
them is ``loadtests/gpu/interleave.py``.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specgate_lab.bench.stats import RequestRecord, percentile

DEFAULT_RESAMPLES = 2000


@dataclass(frozen=True, slots=True)
class Interval:
    point: float
    lo: float
    hi: float
    n: int  # rounds (or windows) it rests on

    def contains(self, x: float) -> bool:
        return self.lo <= x <= self.hi

    def as_dict(self) -> dict[str, float | int]:
        return {"point": self.point, "lo": self.lo, "hi": self.hi, "n": self.n}


def _quantile(sorted_xs: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    pos = (len(sorted_xs) - 1) * q
    i = math.floor(pos)
    j = min(i + 1, len(sorted_xs) - 1)
    return sorted_xs[i] + (sorted_xs[j] - sorted_xs[i]) * (pos - i)


def _bootstrap(
    values: Sequence[float], stat: str, *, resamples: int, seed: int, level: float
) -> tuple[float, float, float]:
    def of(xs: Sequence[float]) -> float:
        m = sum(xs) / len(xs)
        return math.exp(m) if stat == "geo" else m

    point = of(values)
    if len(values) < 2:
        return point, point, point
    rng = random.Random(seed)
    n = len(values)
    stats = sorted(of([values[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    tail = (1.0 - level) / 2.0
    return point, _quantile(stats, tail), _quantile(stats, 1.0 - tail)


def mean_interval(
    values: Sequence[float], *, resamples: int = DEFAULT_RESAMPLES, seed: int = 0, level: float = 0.95
) -> Interval:
    """The mean of per-window figures with its bootstrap interval over windows."""
    if not values:
        raise ValueError("no windows")
    point, lo, hi = _bootstrap(list(values), "mean", resamples=resamples, seed=seed, level=level)
    return Interval(point, lo, hi, len(values))


def paired_ratio(
    a: Sequence[float],
    b: Sequence[float],
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    level: float = 0.95,
) -> Interval:
    """How ``a`` compares with ``b`` when ``a[i]`` and ``b[i]`` were measured in the same
    round: the geometric mean of the per-round ratios a/b, with its bootstrap interval over
    rounds (a round whose figure is missing or not positive on either side is left out)."""
    if len(a) != len(b):
        raise ValueError("a and b must pair round by round")
    logs = [math.log(x / y) for x, y in zip(a, b, strict=True) if x > 0 and y > 0]
    if not logs:
        raise ValueError("no round has both figures")
    point, lo, hi = _bootstrap(logs, "geo", resamples=resamples, seed=seed, level=level)
    return Interval(point, lo, hi, len(logs))


CLASSES = ("t0", "sampled")  # greedy requests, and sampled ones (T > 0)
_FIGURES = ("tpot_mean_ms", "tpot_p99_ms", *(f"tpot_mean_ms_{c}" for c in CLASSES))


def klass(temperature: float) -> str:
    return "t0" if temperature <= 0.0 else "sampled"


def slot_labels(slots: list[str]) -> list[str]:
    """``adaptive, always-spec, adaptive`` → ``adaptive, always-spec, adaptive#2``."""
    seen: dict[str, int] = {}
    out = []
    for s in slots:
        seen[s] = seen.get(s, 0) + 1
        out.append(s if seen[s] == 1 else f"{s}#{seen[s]}")
    return out


def window_row(conc: int, rnd: int, label: str, policy: str, recs: list[RequestRecord]) -> dict[str, Any]:
    """One window's figures (TPOT in ms; None where no request of the class finished)."""
    row: dict[str, Any] = {"concurrency": conc, "round": rnd, "slot": label, "policy": policy}

    def tpots(rs: list[RequestRecord]) -> list[float]:
        return [r.tpot * 1000.0 for r in rs if r.ok and r.tpot is not None]

    all_t = tpots(recs)
    row["requests"] = len(recs)
    row["failures"] = sum(1 for r in recs if not r.ok)
    row["tpot_mean_ms"] = statistics.fmean(all_t) if all_t else None
    row["tpot_p99_ms"] = percentile(all_t, 99)
    routed = [r.route for r in recs if r.route]
    row["spec_share"] = sum(1 for x in routed if x == "spec") / len(routed) if routed else None
    for c in CLASSES:
        t = tpots([r for r in recs if klass(r.temperature) == c])
        row[f"tpot_mean_ms_{c}"] = statistics.fmean(t) if t else None
    return row


def _figure(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) if r.get(key) is not None else 0.0 for r in rows]


def compare(windows: list[dict[str, Any]], labels: list[str], seed: int = 0) -> dict[str, Any]:
    """Per concurrency: each slot's mean over windows, and every pair of slots compared
    round by round (the repeated policy's pair is the A/A), overall and per class."""
    out: dict[str, Any] = {}
    for conc in sorted({int(w["concurrency"]) for w in windows}):
        at = [w for w in windows if int(w["concurrency"]) == conc]
        rounds = sorted({int(w["round"]) for w in at})
        by = {(w["slot"], int(w["round"])): w for w in at}
        slots: dict[str, Any] = {}
        for lab in labels:
            ws = [by[(lab, r)] for r in rounds if (lab, r) in by]
            entry: dict[str, Any] = {"windows": len(ws), "requests": sum(int(w["requests"]) for w in ws)}
            for key in _FIGURES:
                vals = [float(w[key]) for w in ws if w.get(key) is not None]
                entry[key] = mean_interval(vals, seed=seed).as_dict() if vals else None
            slots[lab] = entry
        pairs: dict[str, Any] = {}
        for i, a in enumerate(labels):
            for b in labels[i + 1 :]:
                both = [r for r in rounds if (a, r) in by and (b, r) in by]
                if not both:
                    continue
                entry = {}
                for key in _FIGURES:
                    xa = _figure([by[(a, r)] for r in both], key)
                    xb = _figure([by[(b, r)] for r in both], key)
                    try:
                        entry[key] = paired_ratio(xa, xb, seed=seed).as_dict()
                    except ValueError:
                        entry[key] = None
                pairs[f"{a} / {b}"] = entry
        out[str(conc)] = {"slots": slots, "pairs": pairs}
    return out


def _fmt(iv: dict[str, Any] | None, digits: int = 2) -> str:
    if iv is None:
        return "–"
    return f"{iv['point']:.{digits}f} [{iv['lo']:.{digits}f}, {iv['hi']:.{digits}f}]"


def report_md(result: dict[str, Any], meta: dict[str, Any]) -> str:
    lines = [
        f"# Interleaved windows: {meta['pair']} pair, slots {', '.join(meta['labels'])}",
        "",
        f"{meta['rounds']} rounds of {meta['measure_s']:.0f}-s windows per concurrency "
        f"(target {meta['target']}, time scale {meta['time_scale']}). Intervals: 95 % bootstrap "
        "over windows (slots) and over rounds (ratios of windows of the same round).",
    ]
    for conc, r in result.items():
        lines += ["", f"## C = {conc}", "", "| slot | windows | requests | TPOT mean (ms) | TPOT p99 (ms) |"]
        lines.append("|---|---|---|---|---|")
        for lab, s in r["slots"].items():
            mean, p99 = _fmt(s["tpot_mean_ms"]), _fmt(s["tpot_p99_ms"])
            lines.append(f"| {lab} | {s['windows']} | {s['requests']} | {mean} | {p99} |")
        lines += ["", "| comparison | mean TPOT ratio | p99 ratio | T=0 | T>0 |", "|---|---|---|---|---|"]
        for name, p in r["pairs"].items():
            cells = [_fmt(p.get(k), 3) for k in _FIGURES]
            lines.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"
