"""Scenario metrics from per-request records: oracle, goodput, worst minute, time to switch.

Everything here is pure arithmetic over records (arrival time, route, TPOT, TTFT, output
tokens), so the simulator and ``specgate bench`` (real sockets) report the same numbers the
same way.

* **Windows** are 60-s slices of *arrival* time aligned with the start of the run (so they
  fall on a scenario's phase boundaries); arrivals during the warm-up are not counted.
* **Oracle** of the two statics: in each window the static policy (always-spec or
  always-base) whose requests had the lower mean TPOT; the oracle's records are those
  requests pooled over all windows (it switches for free and knows the future minute).
* **Goodput**: output tokens per second of measured window, counting only the requests
  that finished with TPOT ≤ the TPOT SLO and TTFT ≤ the TTFT SLO.
* **Worst minute**: the largest ratio, over windows, of adaptive's mean TPOT to the better
  static's mean TPOT in that window.
* **Time to switch**: where the better static changes between consecutive *decided*
  windows (the statics differ by at least ``margin``), the seconds from the start of the
  later window until adaptive's share of arrivals routed to the newly better engine, over
  the trailing ``share_window_s``, first exceeds 50 % (0 when it already does; None when it
  never does before the run ends).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from gateway.routing.factory import STATIC_BASELINES

WINDOW_S = 60.0
SHARE_WINDOW_S = 10.0
SWITCH_MARGIN = 0.02
SPEC, BASE = STATIC_BASELINES


class Rec(Protocol):
    @property
    def arrival(self) -> float: ...
    @property
    def route(self) -> str: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def ttft_s(self) -> float | None: ...
    @property
    def tpot_s(self) -> float | None: ...
    @property
    def finished_at(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class Slo:
    tpot_ms: float = 20.0
    ttft_ms: float = 1000.0


def mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan


def pct(xs: Sequence[float], p: float) -> float:
    """The simulator's percentile (``p`` in 0..1; NaN for no values): the sorted value at
    index ``floor(p * n)``, the largest for ``p * n >= n - 1``. A sample value, never an
    interpolation (``p99`` of 100 values is the largest).

    The one definition every simulator summary uses (``run`` and the scenario analysis).
    Not :func:`statistics.quantiles`: both of its methods interpolate between neighbours,
    so it cannot give this value, and changing the definition would move every recorded
    simulator p99 (``results/sim``). ``specgate bench``'s sweep reports interpolated
    percentiles instead (:func:`specgate_lab.bench.stats.percentile`).
    """
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))]


def measured(records: Iterable[Rec], t0: float, t1: float) -> list[Rec]:
    return [r for r in records if t0 <= r.arrival < t1]


def meets(r: Rec, slo: Slo) -> bool:
    return (
        r.finished_at is not None
        and r.tpot_s is not None
        and r.ttft_s is not None
        and r.tpot_s * 1e3 <= slo.tpot_ms
        and r.ttft_s * 1e3 <= slo.ttft_ms
    )


def summarize(records: Sequence[Rec], span_s: float, slo: Slo) -> dict[str, float]:
    """Whole-window metrics of one policy's records (already restricted to the window)."""
    done = [r for r in records if r.finished_at is not None]
    tpots = [r.tpot_s * 1e3 for r in done if r.tpot_s is not None]
    ttfts = [r.ttft_s * 1e3 for r in done if r.ttft_s is not None]
    good = [r for r in done if meets(r, slo)]
    n = len(records)
    return {
        "requests": n,
        "finished": len(done),
        "mean_tpot_ms": mean(tpots),
        "p99_tpot_ms": pct(tpots, 0.99),
        "mean_ttft_ms": mean(ttfts),
        "p99_ttft_ms": pct(ttfts, 0.99),
        "output_tok_s": sum(r.output_tokens for r in done) / span_s if span_s > 0 else math.nan,
        "goodput_tok_s": sum(r.output_tokens for r in good) / span_s if span_s > 0 else math.nan,
        "slo_share": len(good) / n if n else math.nan,
        "spec_share": sum(1 for r in records if r.route == "spec") / n if n else math.nan,
    }


def window_of(t: float, window_s: float = WINDOW_S) -> int:
    return int(t // window_s)


def window_tpot(records: Iterable[Rec], t0: float, window_s: float = WINDOW_S) -> dict[int, float]:
    """Mean TPOT (ms) of the requests arriving in each window (windows without one absent)."""
    acc: dict[int, list[float]] = {}
    for r in records:
        if r.tpot_s is not None and r.arrival >= t0:
            acc.setdefault(window_of(r.arrival, window_s), []).append(r.tpot_s * 1e3)
    return {w: mean(v) for w, v in acc.items()}


def oracle_choice(spec: dict[int, float], base: dict[int, float]) -> dict[int, str]:
    """Per window, the static with the lower mean TPOT (the one with data where only one has)."""
    out: dict[int, str] = {}
    for w in sorted(set(spec) | set(base)):
        s, b = spec.get(w, math.inf), base.get(w, math.inf)
        out[w] = SPEC if s <= b else BASE
    return out


def oracle_records(
    spec_recs: Sequence[Rec],
    base_recs: Sequence[Rec],
    choice: dict[int, str],
    window_s: float = WINDOW_S,
) -> list[Rec]:
    """The chosen static's requests of every window, pooled (arrival order)."""
    out: list[Rec] = []
    for name, recs in ((SPEC, spec_recs), (BASE, base_recs)):
        out += [r for r in recs if choice.get(window_of(r.arrival, window_s)) == name]
    return sorted(out, key=lambda r: r.arrival)


def worst_minute(
    adaptive: dict[int, float], spec: dict[int, float], base: dict[int, float]
) -> tuple[float, int] | None:
    """(max over windows of adaptive ÷ the better static of that window, its window index)."""
    worst: tuple[float, int] | None = None
    for w, a in adaptive.items():
        best = min(spec.get(w, math.inf), base.get(w, math.inf))
        if math.isfinite(best) and best > 0:
            ratio = a / best
            if worst is None or ratio > worst[0]:
                worst = (ratio, w)
    return worst


def capture(adaptive: float, best_static: float, oracle: float) -> float | None:
    """Share of the oracle's gain over the best static that adaptive captured (1 = all of
    it, 0 = none, < 0 = worse than the best static); None when the oracle has no gain."""
    gain = best_static - oracle
    if not gain > 0:
        return None
    return (best_static - adaptive) / gain


@dataclass(frozen=True, slots=True)
class Switch:
    at_s: float  # start of the window where the better static changed (arrival time)
    to: str  # "spec" or "base": the newly better engine
    margin: float  # how much better it is in that window (ratio - 1)
    delay_s: float | None  # seconds until adaptive's share crossed 50 %; None: never


def switch_times(
    adaptive: Sequence[Rec],
    spec: dict[int, float],
    base: dict[int, float],
    *,
    window_s: float = WINDOW_S,
    margin: float = SWITCH_MARGIN,
    share_window_s: float = SHARE_WINDOW_S,
) -> list[Switch]:
    """Every change of the better static between consecutive decided windows (see the
    module docstring) and how long adaptive took to follow it."""
    recs = sorted(adaptive, key=lambda r: r.arrival)
    times = [r.arrival for r in recs]
    cum = [0]
    for r in recs:
        cum.append(cum[-1] + (r.route == "spec"))
    decided: list[tuple[int, str, float]] = []
    for w in sorted(set(spec) & set(base)):
        ratio = spec[w] / base[w] if base[w] > 0 else math.inf
        if ratio <= 1 - margin:
            decided.append((w, "spec", 1 / ratio - 1))
        elif ratio >= 1 + margin:
            decided.append((w, "base", ratio - 1))
    out: list[Switch] = []
    for (_, prev, _), (w, to, m) in itertools.pairwise(decided):
        if to == prev:
            continue
        tc = w * window_s
        delay: float | None = None
        for i in range(bisect.bisect_left(times, tc), len(times)):
            lo = bisect.bisect_right(times, times[i] - share_window_s)
            n = i + 1 - lo
            spec_share = (cum[i + 1] - cum[lo]) / n
            if (spec_share > 0.5) if to == "spec" else (spec_share < 0.5):
                delay = max(0.0, times[i] - tc)
                break
        out.append(Switch(tc, to, m, delay))
    return out
