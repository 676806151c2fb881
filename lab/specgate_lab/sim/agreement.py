"""Whether gateway replicas in front of one pair agree: samples of their modes and of the
pair's engines, reduced to the figures that show a split.

A split pair makes every request wait for both engines' steps. Two figures show it: the
share of samples in which the replicas' modes differ, and the share in which both engines
had requests running. :func:`switch_spread` adds how far apart the replicas switched for
the same change. The simulator (:mod:`specgate_lab.sim.run`) and the real-socket benchmark
(:mod:`specgate_lab.bench.replicas`) sample the same way and report through these functions.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Sample:
    at: float  # seconds on the run's clock
    modes: tuple[str | None, ...]  # each replica's mode of the model (None: no mode, or unreadable)
    running: tuple[float, ...]  # requests running on each engine of the pair


def agreement(samples: Sequence[Sample], t0: float = 0.0) -> dict[str, float]:
    """``modes_differ`` and ``both_engines_busy`` over the samples from ``t0`` on."""
    xs = [s for s in samples if s.at >= t0]
    if not xs:
        return {"modes_differ": 0.0, "both_engines_busy": 0.0}
    differ = sum(1 for s in xs if len(set(s.modes)) > 1)
    both = sum(1 for s in xs if len(s.running) >= 2 and all(r > 0 for r in s.running))
    return {"modes_differ": differ / len(xs), "both_engines_busy": both / len(xs)}


def switch_spread(samples: Sequence[Sample], t0: float = 0.0) -> float | None:
    """The largest gap between replicas switching mode for the same change: the k-th
    switch of every replica is taken as one change (seconds; None when the replicas did
    not switch equally often, 0.0 when none switched)."""
    xs = [s for s in samples if s.at >= t0 and None not in s.modes]
    if not xs:
        return None
    n = len(xs[0].modes)
    flips: list[list[float]] = [[] for _ in range(n)]
    for a, b in itertools.pairwise(xs):
        for i in range(n):
            if a.modes[i] != b.modes[i]:
                flips[i].append(b.at)
    if len({len(f) for f in flips}) != 1:
        return None
    return max((max(ts) - min(ts) for ts in zip(*flips, strict=True)), default=0.0)
