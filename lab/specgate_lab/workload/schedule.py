"""Target-QPS schedules shared by the Locust kit and ``specgate bench``.

Spec grammar (comma-separated stages, run in order):

* ``4``            constant 4 req/s (until the run time ends)
* ``2:30``         2 req/s for 30 s
* ``1:30,2:30,4:60``  steps
* ``ramp:0.5-8:120``  linear ramp from 0.5 to 8 req/s over 120 s
* ``steps:1-16:5x20`` 5 geometric steps from 1 to 16 req/s, 20 s each

Stages can be mixed: ``ramp:1-4:60,4:120``.

:class:`PoissonPacer` spreads a schedule over a pool of senders that each send one request
at a time; :func:`pool_size` says how many senders carry a QPS (Little's law).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Stage:
    start_qps: float
    end_qps: float
    duration_s: float  # math.inf for an open-ended last stage

    def qps_at(self, t: float) -> float:
        if self.start_qps == self.end_qps or not math.isfinite(self.duration_s):
            return self.start_qps
        return self.start_qps + (self.end_qps - self.start_qps) * min(1.0, max(0.0, t / self.duration_s))


@dataclass(frozen=True, slots=True)
class Schedule:
    stages: tuple[Stage, ...]

    @property
    def duration_s(self) -> float:
        return sum(s.duration_s for s in self.stages)

    def stage_index(self, t: float) -> int | None:
        """Index of the stage running at ``t`` seconds, None once the schedule is over."""
        if t < 0:
            return 0
        acc = 0.0
        for i, s in enumerate(self.stages):
            if t < acc + s.duration_s:
                return i
            acc += s.duration_s
        return None

    def qps_at(self, t: float) -> float | None:
        """Target QPS at ``t`` seconds after the start; None once the schedule is over."""
        acc = 0.0
        for s in self.stages:
            if t < acc + s.duration_s:
                return s.qps_at(t - acc)
            acc += s.duration_s
        return None

    @property
    def peak_qps(self) -> float:
        return max(max(s.start_qps, s.end_qps) for s in self.stages)

    def describe(self) -> str:
        parts = []
        for s in self.stages:
            d = "∞" if not math.isfinite(s.duration_s) else f"{s.duration_s:g}s"
            if s.start_qps == s.end_qps:
                parts.append(f"{s.start_qps:g} qps × {d}")
            else:
                parts.append(f"{s.start_qps:g}→{s.end_qps:g} qps over {d}")
        return ", ".join(parts)


def _qps(text: str) -> float:
    v = float(text)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"QPS must be a finite number >= 0, got {text!r}")
    return v


def _dur(text: str) -> float:
    v = float(text.rstrip("s"))
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"stage duration must be > 0 seconds, got {text!r}")
    return v


def parse_schedule(spec: str) -> Schedule:
    """Parse a schedule spec (see the module docstring). Raises ValueError with the reason."""
    stages: list[Stage] = []
    items = [p.strip() for p in spec.split(",") if p.strip()]
    if not items:
        raise ValueError("empty QPS schedule")
    try:
        for i, item in enumerate(items):
            last = i == len(items) - 1
            if item.startswith("ramp:"):
                rng, _, dur = item[len("ramp:") :].partition(":")
                lo, _, hi = rng.partition("-")
                stages.append(Stage(_qps(lo), _qps(hi), _dur(dur)))
            elif item.startswith("steps:"):
                rng, _, rest = item[len("steps:") :].partition(":")
                lo, _, hi = rng.partition("-")
                n_text, _, dur = rest.partition("x")
                a, b, n = _qps(lo), _qps(hi), int(n_text)
                if n < 1 or a <= 0:
                    raise ValueError("steps needs n >= 1 and a start QPS > 0")
                ratio = (b / a) ** (1 / (n - 1)) if n > 1 else 1.0
                stages += [Stage(round(a * ratio**j, 3), round(a * ratio**j, 3), _dur(dur)) for j in range(n)]
            elif ":" in item:
                q, _, dur = item.partition(":")
                stages.append(Stage(_qps(q), _qps(q), _dur(dur)))
            elif last:
                stages.append(Stage(_qps(item), _qps(item), math.inf))
            else:
                raise ValueError(f"stage {item!r} needs a duration (QPS:SECONDS) unless it is the last")
    except ValueError as exc:
        raise ValueError(f"bad QPS schedule {spec!r}: {exc}") from None
    return Schedule(tuple(stages))


class PoissonPacer:
    """Arrival times of one member of a pool of ``pool`` senders that together offer a
    schedule's QPS: each runs a Poisson process of rate ``qps(t) / pool``. With ``pool=1``
    it is the whole schedule's arrival stream, which senders can share: each idle sender
    takes the next arrival (the Locust kit's users do).

    Arrivals are scheduled on an absolute timeline, so a sender that was busy past its
    next arrival sends at once (the backlog is caught up, the average rate holds).
    """

    def __init__(self, schedule: Schedule, pool: float, rng: random.Random) -> None:
        if not pool >= 1:
            raise ValueError("pool must be >= 1")
        self.schedule = schedule
        self.pool = pool
        self.rng = rng
        self.next_at: float | None = None  # seconds since the schedule's start
        self.over = False  # the schedule has ended: no more arrivals

    def advance(self, now: float) -> float | None:
        """Schedule the next arrival after the previous one (or after ``now`` at first) and
        return it, in seconds since the schedule's start; None once the schedule is over."""
        if self.over:
            return None
        t = now if self.next_at is None else self.next_at
        while True:
            qps = self.schedule.qps_at(t)
            if qps is None:
                self.over = True
                return None
            if qps > 0:
                break
            t += 0.5  # a zero-QPS stretch: look again a little later
        t += self.rng.expovariate(qps / self.pool)
        if self.schedule.qps_at(t) is None:
            self.over = True
            return None
        self.next_at = t
        return t


# Pool sizing (Little's law): senders that share one arrival stream and each wait for
# their answer carry ``qps`` as long as the ``qps * latency`` requests in flight on average
# (more in a Poisson burst, more when the latency grows with the load) fit in the pool:
# twice that, plus a few, leaves an idle sender for almost every arrival.
POOL_HEADROOM = 2.0
POOL_SPARE = 8
POOL_LATENCY_GUESS_S = 10.0  # assumed before the first answers are timed
POOL_MAX = 4096


def pool_size(qps: float, latency_s: float = POOL_LATENCY_GUESS_S, *, cap: int = POOL_MAX) -> int:
    """Senders sharing one :class:`PoissonPacer` stream needed to offer ``qps`` when a
    request takes ``latency_s`` seconds: ``2 * qps * latency_s + 8``, at most ``cap``."""
    if not (math.isfinite(qps) and math.isfinite(latency_s)) or qps < 0 or latency_s < 0:
        raise ValueError(f"pool_size needs finite qps and latency >= 0, got {qps!r}, {latency_s!r}")
    return min(cap, POOL_SPARE + math.ceil(POOL_HEADROOM * qps * latency_s))


def grown_pool(current: int, qps: float, latency_s: float | None, *, cap: int = POOL_MAX) -> int:
    """The pool to keep once requests are seen to take ``latency_s`` (None: none timed yet):
    grown to :func:`pool_size` when that is larger, never shrunk (a smaller pool would stop
    senders in the middle of their requests)."""
    if latency_s is None:
        return current
    return max(current, pool_size(qps, latency_s, cap=cap))
