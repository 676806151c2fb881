"""The traffic mix the two regimes are priced on: the requests of the last seconds.

The pair serves all of its recent traffic in one regime, so the regimes are compared on
that traffic, not on the one request at hand. The window holds the requests of the last
``window_s`` seconds but at least ``min_requests`` of the most recent (and at most
``MAX_REQUESTS``).

Each entry records *what* arrived (its class: kind and temperature, and its prior), not
what was believed of it on arrival: the mix is priced with what the policy knows now
(:meth:`TrafficMix.priced`). When traffic moves to a temperature or class never seen
before, the first answers correct the estimate of every request of that class still in
the window, instead of the stale guess lingering for a whole window.

A change of traffic ends the window (:func:`change_point`): when its newest requests price
apart from the older ones by more than chance explains, the older ones are dropped. A
window mean needs most of its requests to be new before it crosses break-even (a window
of copy-heavy edits turning into open chat crosses at ~80 % chat), which made detection
as slow as the window; stationary mixed traffic keeps its whole window, since its older
requests vary as much as the newest.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

MAX_REQUESTS = 128
CHANGE_MIN = 3  # requests each side of a change point needs
# the price spread assumed at the least (1/E units): same-class requests price alike, and
# a segment of one class must not make any difference look significant
_SD_FLOOR = 0.1
# A change shows first in the newest requests: the newest side of a split is at most a
# third of the window (or CHANGE_MIN). A split deep in the window is one the test would
# have seen earlier were it a change; in stationary traffic it is a run of chance.
_NEW_SHARE = 1.0 / 3.0


@dataclass(frozen=True, slots=True)
class MixEntry:
    at: float
    klass: tuple[str, int]  # (kind, temperature bucket): what is learned per class
    prior_tokens_per_step: float  # E the prior predicts for the request (from its features)
    prior_verified: float  # tokens a spec step would verify for it, as the prior predicts


# (entry) -> (E before the live correction, tokens a spec step verifies for it)
Pricer = Callable[[MixEntry], tuple[float, float]]


@dataclass(frozen=True, slots=True)
class MixPrice:
    mean_inverse_tokens_per_step: float  # mean 1/E, each E live-corrected: 1 + (E − 1)·ratio
    mean_verified: float | None  # mean tokens verified per sequence and step (None: no traffic)
    # standard error of mean_inverse_tokens_per_step: how far a window of this few requests
    # drawn from the same traffic would put it by chance
    inverse_se: float = 0.0


@dataclass
class TrafficMix:
    window_s: float
    min_requests: int
    change_z: float = 0.0  # standard errors apart that end the window (0: never)
    entries: deque[MixEntry] = field(default_factory=deque)
    _version: int = 0
    _cache: tuple[int, Hashable, MixPrice] | None = None

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, entry: MixEntry) -> None:
        mix = self.entries
        mix.append(entry)
        lo, oldest = self.min_requests, entry.at - self.window_s
        while len(mix) > MAX_REQUESTS or (len(mix) > lo and mix[0].at < oldest):
            mix.popleft()
        self._version += 1

    def priced(self, price: Pricer, live_ratio: float, knowledge: Hashable) -> MixPrice:
        """The mix priced entry by entry by ``price``; memoised until the mix, the live ratio
        or ``knowledge`` (a token that changes whenever ``price`` would) changes."""
        c = self._cache
        if c is not None and c[0] == self._version and c[1] == (live_ratio, knowledge):
            return c[2]
        if not self.entries:
            out = MixPrice(1.0, None)
        else:
            xs: list[float] = []
            qs: list[float] = []
            for m in self.entries:
                e, q = price(m)
                xs.append(1.0 / (1.0 + (e - 1.0) * live_ratio))
                qs.append(q)
            cut = change_point(xs, self.change_z) if self.change_z > 0 else 0
            if cut:  # the traffic changed: the window starts at its change
                for _ in range(cut):
                    self.entries.popleft()
                del xs[:cut], qs[:cut]
                self._version += 1
            inv, sq, verified = sum(xs), sum(x * x for x in xs), sum(qs)
            n = len(xs)
            mean = inv / n
            var = max(0.0, sq / n - mean * mean) * n / (n - 1) if n > 1 else 0.0
            out = MixPrice(mean, verified / n, math.sqrt(var / n))
        self._cache = (self._version, (live_ratio, knowledge), out)
        return out


def change_point(xs: list[float], z: float) -> int:
    """Where the newest prices part from the older ones: the index of the first newest
    entry of the most significant split (0: none), each side at least ``CHANGE_MIN`` and
    the newest at most ``_NEW_SHARE`` of the window.

    A split is significant when the two sides' means differ by more than ``z`` standard
    errors, with the spread pooled from both sides (at least ``_SD_FLOOR``): with no change,
    both sides are samples of one traffic, and three requests of one class in a row, which
    price alike, say nothing about its spread."""
    n = len(xs)
    if n < 2 * CHANGE_MIN:
        return 0
    pre = [0.0]
    pre2 = [0.0]
    for x in xs:
        pre.append(pre[-1] + x)
        pre2.append(pre2[-1] + x * x)
    best, at = z, 0
    floor = _SD_FLOOR * _SD_FLOOR
    lo = max(CHANGE_MIN, n - max(CHANGE_MIN, int(n * _NEW_SHARE)))
    for i in range(lo, n - CHANGE_MIN + 1):
        a, b = i, n - i
        ma, mb = pre[i] / a, (pre[n] - pre[i]) / b
        ss = pre2[i] - a * ma * ma + (pre2[n] - pre2[i]) - b * mb * mb
        var = max(floor, ss / (n - 2))
        t = abs(ma - mb) / math.sqrt(var * (1.0 / a + 1.0 / b))
        if t > best:
            best, at = t, i
    return at
