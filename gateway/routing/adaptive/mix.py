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

Pricing is incremental: each entry's price is kept (with running sums) for as long as what
it was priced with holds, so a decision prices only the requests that arrived since the last
one, and the change test reads the window's newest third; the whole window is re-priced when
the knowledge or the live ratio changes (an Endpoint Picker learns from a sampled few
answers: most of its decisions re-price nothing).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice

from gateway.routing.adaptive.knobs import knob


@dataclass(frozen=True, slots=True)
class MixKnobs:
    max_requests: int = knob(128, "requests", "bounds the window's cost per decision at a high rate")
    change_min: int = knob(3, "requests", "each side of a change point needs a few requests")
    sd_floor: float = knob(
        0.1, "1/E", "same-class requests price alike: a segment of one class must not look significant"
    )
    new_share: float = knob(
        1.0 / 3.0,
        "share of the window",
        "a change shows first in the newest requests; a split deep in the window is chance",
    )
    resum_every: int = knob(
        4096, "updates", "running sums are rebuilt this often (bounds their rounding drift)"
    )


_K = MixKnobs()
MAX_REQUESTS, CHANGE_MIN = _K.max_requests, _K.change_min


@dataclass(frozen=True, slots=True)
class MixEntry:
    at: float
    klass: tuple[str, int]  # (kind, temperature bucket): what is learned per class
    prior_tokens_per_step: float  # E the prior predicts for the request (from its features)
    prior_verified: float  # tokens a spec step would verify for it, as the prior predicts


# (entry) -> (E before the live correction, tokens a spec step verifies for it)
Pricer = Callable[[MixEntry], tuple[float, float]]
# (class) -> (weight of the learned E, learned E, weight of the learned verified tokens, learned
# verified tokens): an entry's price blends each with its prior (TrafficMix.priced_by_class)
ClassPricer = Callable[[tuple[str, int]], tuple[float, float, float, float]]


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
    # The prices of the oldest len(_xs) entries (1/E live-corrected, and verified tokens),
    # priced with _key, and their running sums (x, x², q).
    _xs: deque[float] = field(default_factory=deque)
    _qs: deque[float] = field(default_factory=deque)
    _key: Hashable = None
    _sums: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    _updates: int = 0

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, entry: MixEntry) -> None:
        mix = self.entries
        mix.append(entry)
        lo, oldest = self.min_requests, entry.at - self.window_s
        while len(mix) > MAX_REQUESTS or (len(mix) > lo and mix[0].at < oldest):
            self._drop_oldest()
        self._version += 1

    def _drop_oldest(self) -> None:
        self.entries.popleft()
        if self._xs:
            x, q = self._xs.popleft(), self._qs.popleft()
            s = self._sums
            s[0] -= x
            s[1] -= x * x
            s[2] -= q

    def _reprice_all(self, key: Hashable) -> None:
        self._xs.clear()
        self._qs.clear()
        self._sums[:] = [0.0, 0.0, 0.0]
        self._key = key
        self._updates = 0

    def cached(self, live_ratio: float, knowledge: Hashable) -> MixPrice | None:
        """What :meth:`priced` returns now, if it is memoised (the mix, the live ratio and
        ``knowledge`` unchanged since): the caller need not build its pricer."""
        c = self._cache
        if c is not None and c[0] == self._version and c[1] == (live_ratio, knowledge):
            return c[2]
        return None

    def priced(self, price: Pricer, live_ratio: float, knowledge: Hashable) -> MixPrice:
        """The mix priced entry by entry by ``price``; memoised until the mix, the live ratio
        or ``knowledge`` (a token that changes whenever ``price`` would) changes. Entries
        priced earlier with the same live ratio and knowledge keep their price."""
        return self._priced(lambda new: map(price, new), live_ratio, knowledge)

    def priced_by_class(self, learned: ClassPricer, live_ratio: float, knowledge: Hashable) -> MixPrice:
        """:meth:`priced` where an entry's price is its prior blended with what its class
        taught, ``(1 − w) · prior + w · learned`` for E and verified tokens alike, ``learned``
        giving ``(w, E, w_q, q)`` per class (asked once per class and pricing)."""
        return self._priced(lambda new: _blended(new, learned), live_ratio, knowledge)

    def _priced(
        self,
        prices: Callable[[Iterator[MixEntry]], Iterable[tuple[float, float]]],
        live_ratio: float,
        knowledge: Hashable,
    ) -> MixPrice:
        """The mix priced, ``prices`` giving (E, verified tokens) of the entries not priced yet."""
        key = (live_ratio, knowledge)
        c = self._cache
        if c is not None and c[0] == self._version and c[1] == key:
            return c[2]
        if key != self._key or self._updates >= _K.resum_every:
            self._reprice_all(key)
        xs, qs, s = self._xs, self._qs, self._sums
        s0, s1, s2 = s
        done = len(xs)
        for e, q in prices(islice(self.entries, done, None)):
            x = 1.0 / (1.0 + (e - 1.0) * live_ratio)
            xs.append(x)
            qs.append(q)
            s0 += x
            s1 += x * x
            s2 += q
        s[0], s[1], s[2] = s0, s1, s2
        self._updates += len(xs) - done
        if not xs:
            out = MixPrice(1.0, None)
        else:
            cut = change_point(xs, self.change_z, s[0], s[1]) if self.change_z > 0 else 0
            if cut:  # the traffic changed: the window starts at its change
                for _ in range(cut):
                    self._drop_oldest()
                self._version += 1
            n = len(xs)
            mean = s[0] / n
            var = max(0.0, s[1] / n - mean * mean) * n / (n - 1) if n > 1 else 0.0
            out = MixPrice(mean, s[2] / n, math.sqrt(var / n))
        self._cache = (self._version, key, out)
        return out


def _blended(new: Iterable[MixEntry], learned: ClassPricer) -> Iterator[tuple[float, float]]:
    """Each entry's (E, verified tokens): its priors blended with what its class taught, the
    same arithmetic as a per-entry pricer, each class's terms computed once."""
    terms: dict[tuple[str, int], tuple[float, float, float, float]] = {}
    for m in new:
        t = terms.get(m.klass)
        if t is None:
            w, e, wq, q = learned(m.klass)
            t = terms[m.klass] = (1.0 - w, w * e, 1.0 - wq, wq * q)
        yield t[0] * m.prior_tokens_per_step + t[1], t[2] * m.prior_verified + t[3]


def change_point(
    xs: Sequence[float], z: float, total: float | None = None, total_sq: float | None = None
) -> int:
    """Where the newest prices part from the older ones: the index of the first newest
    entry of the most significant split (0: none), each side at least ``CHANGE_MIN`` and
    the newest at most ``new_share`` of the window. ``total`` / ``total_sq``: the sums of
    ``xs`` and of their squares, where known (only the newest third is then read).

    A split is significant when the two sides' means differ by more than ``z`` standard
    errors, with the spread pooled from both sides (at least ``sd_floor``): with no change,
    both sides are samples of one traffic, and three requests of one class in a row, which
    price alike, say nothing about its spread."""
    n = len(xs)
    if n < 2 * CHANGE_MIN:
        return 0
    if total is None or total_sq is None:
        total, total_sq = math.fsum(xs), math.fsum(x * x for x in xs)
    lo = max(CHANGE_MIN, n - max(CHANGE_MIN, int(n * _K.new_share)))
    hi = n - CHANGE_MIN
    if lo > hi:
        return 0
    # The newest side's sums for each split, from the end back to ``lo``; the test compares
    # squared statistics (t² against z²), the same order without a square root per split.
    tail = list(islice(xs, lo, n))
    best, at = z * z, 0
    floor = _K.sd_floor * _K.sd_floor
    dof = 1.0 / (n - 2)
    sb = 0.0
    for x in tail[hi - lo + 1 :]:  # the newest CHANGE_MIN - 1: no split among them
        sb += x
    i = hi
    for x in reversed(tail[: hi - lo + 1]):  # the split xs[:i] | xs[i:], i from hi down to lo
        sb += x
        b = n - i
        ma = (total - sb) / i
        mb = sb / b
        var = (total_sq - i * ma * ma - b * mb * mb) * dof  # both sides' squared deviations
        if var < floor:
            var = floor
        d = ma - mb
        t2 = d * d / (var * (1.0 / i + 1.0 / b))
        if t2 > best or (t2 == best and at):  # ties: the oldest split, as read from the start
            best, at = t2, i
        i -= 1
    return at
