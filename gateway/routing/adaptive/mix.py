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
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

MAX_REQUESTS = 128


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
            inv = sq = verified = 0.0
            for m in self.entries:
                e, q = price(m)
                x = 1.0 / (1.0 + (e - 1.0) * live_ratio)
                inv += x
                sq += x * x
                verified += q
            n = len(self.entries)
            mean = inv / n
            var = max(0.0, sq / n - mean * mean) * n / (n - 1) if n > 1 else 0.0
            out = MixPrice(mean, verified / n, math.sqrt(var / n))
        self._cache = (self._version, (live_ratio, knowledge), out)
        return out
