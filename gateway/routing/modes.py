"""Break-even fallback with hysteresis, and bounded probing, per request class.

A class (request kind × temperature bucket) is either *speculating* (each request goes
where its own prediction says) or in *fallback* (everything goes to the plain engine but
for probes). The mode follows a time-smoothed predicted speed-up of the class and flips
only when it crosses ``1 + margin`` by more than ``band``, and no sooner than ``dwell_s``
after the last flip, so noise in the scraped metrics does not make it flap.

While in fallback, the spec engine sees none of the class's traffic, so nothing measures
whether acceptance recovered. :class:`Prober` sends a bounded share of eligible requests
(deterministically every ⌈1/share⌉-th) and at least one per ``interval_s`` to spec.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class ModeTracker:
    margin: float
    band: float
    dwell_s: float
    smoothing_s: float
    speculating: bool = True
    smoothed: float | None = None
    last_update: float = 0.0
    last_flip: float = -math.inf
    flips: int = 0

    def update(self, speedup: float, now: float) -> bool:
        """Feed one predicted speed-up; returns whether the class is speculating."""
        if self.smoothed is None:
            self.smoothed = speedup
            self.speculating = speedup > 1.0  # no history: the predicted-faster regime
            self.last_update = now
            return self.speculating
        a = 1.0 - math.exp(-max(0.0, now - self.last_update) / self.smoothing_s)
        a = max(a, 0.05)  # bursts of requests at one instant still move the average
        self.smoothed += a * (speedup - self.smoothed)
        self.last_update = now
        if now - self.last_flip >= self.dwell_s:
            if self.speculating and self.smoothed < 1.0 + self.margin - self.band:
                self._flip(False, now)
            elif not self.speculating and self.smoothed > 1.0 + self.margin + self.band:
                self._flip(True, now)
        return self.speculating

    def _flip(self, speculating: bool, now: float) -> None:
        self.speculating = speculating
        self.last_flip = now
        self.flips += 1

    @property
    def spec_threshold(self) -> float:
        """Per-request threshold while speculating (the lower edge of the band: sticky)."""
        return 1.0 + self.margin - self.band


@dataclass
class Prober:
    share: float
    interval_s: float
    eligible: int = 0
    probes: int = 0
    last_probe: float = -math.inf

    def should_probe(self, now: float) -> bool:
        self.eligible += 1
        due = now - self.last_probe >= self.interval_s
        by_share = self.share > 0 and self.probes + 1 <= self.eligible * self.share
        if due or by_share:
            self.probes += 1
            self.last_probe = now
            return True
        return False
