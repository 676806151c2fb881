"""The traffic mix the two regimes are priced on: the requests of the last seconds.

Each eligible request adds what the policy learned of its class (tokens per speculative
step E before the live correction, tokens verified per spec step). The
regimes are compared on this recent traffic, not on the one request at hand: the pair
serves all of it in one regime. The window holds the requests of the last ``window_s``
seconds but at least ``min_requests`` of the most recent (and at most ``MAX_REQUESTS``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

MAX_REQUESTS = 128


@dataclass(frozen=True, slots=True)
class MixEntry:
    at: float
    tokens_per_step: float  # learned E of the request's class, before the live correction
    verified: float  # tokens a spec step verifies for it (1 + drafts)


@dataclass
class TrafficMix:
    window_s: float
    min_requests: int
    entries: deque[MixEntry] = field(default_factory=deque)
    _verified_sum: float = 0.0
    _version: int = 0
    _inv_cache: tuple[int, float, float] | None = None  # (version, live ratio, mean 1/E)

    def __len__(self) -> int:
        return len(self.entries)

    def add(self, entry: MixEntry) -> None:
        mix = self.entries
        mix.append(entry)
        self._verified_sum += entry.verified
        lo, oldest = self.min_requests, entry.at - self.window_s
        while len(mix) > MAX_REQUESTS or (len(mix) > lo and mix[0].at < oldest):
            self._verified_sum -= mix.popleft().verified
        self._version += 1

    def mean_inverse_tokens_per_step(self, live_ratio: float) -> float:
        """Mean 1/E of the recent traffic, each E corrected by the live acceptance ratio
        (1 + (E - 1) · ratio); 1 with no traffic. Memoised per (mix, ratio)."""
        if not self.entries:
            return 1.0
        c = self._inv_cache
        if c is not None and c[0] == self._version and c[1] == live_ratio:
            return c[2]
        r = live_ratio
        inv = sum(1.0 / (1.0 + (m.tokens_per_step - 1.0) * r) for m in self.entries) / len(self.entries)
        self._inv_cache = (self._version, r, inv)
        return inv

    def mean_verified(self) -> float | None:
        """Mean tokens a spec step verifies per sequence (None with no traffic)."""
        return self._verified_sum / len(self.entries) if self.entries else None
