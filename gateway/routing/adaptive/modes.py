"""Regime switching on accumulated evidence.

A model is either *speculating* (its traffic goes to the spec engine) or in *fallback*
(to the plain engine, but for probes). The mode flips when the evidence against it,
integrated over time, exceeds ``evidence``: while speculating, the integral of how far
the predicted speed-up sits below ``1 + margin - band``; in fallback, of how far it sits
above ``1 + margin + band`` (a one-sided CUSUM in continuous time; it decays back to zero
while the prediction is on the mode's side). One mechanism gives both behaviours a
router needs: a decisive change (copy-heavy edits giving way to open chat, predicted
speed-up 1.8 → 0.9) flips within seconds, while a prediction that hovers near the
break-even point, where the model's own error is as large as the difference, never
accumulates enough to flip, so noise does not make the pair flap. The band would also
hold the pair in fallback while spec is steadily a few per cent faster (a prediction of
1.06 under an upper edge of 1.07 or more): in fallback, a prediction above ``1 + margin``
for ``persist_s`` seconds on balance (seconds above less seconds below) flips it too; on
spec the band's lower edge keeps it there while the edge holds, and the measured latency
decides. Each flip costs a drain
(both engines step while the old one empties), which is what ``evidence`` buys.

Only :class:`~gateway.routing.adaptive.controller.RegimeController` changes the mode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class ModeTracker:
    margin: float
    band: float
    evidence: float  # speed-up × seconds beyond the band needed to flip (default of update)
    speculating: bool = True
    last: float | None = None  # the latest predicted speed-up
    last_update: float = 0.0
    last_flip: float = -math.inf
    flips: int = 0
    against: float = 0.0  # accumulated evidence against the current mode
    premium: float = 0.0  # extra speed-up speculation must clear, beyond margin and band
    # the latest prediction's own sampling error: the band widens by it on both sides
    noise: float = 0.0
    # In fallback, a prediction that stays above 1 + margin (+ premium), inside the band,
    # for this long on balance flips the mode too (0: never): see :meth:`update`.
    persist_s: float = 0.0
    above_s: float = 0.0  # seconds above that edge, less seconds below it (at least 0)
    # A flip at a moment that is not cheap waits until its evidence (or persistence) is
    # this many times what a cheap flip needs.
    patience: float = 2.0

    @property
    def lower(self) -> float:
        """Speculating flips to fallback below this predicted speed-up."""
        return 1.0 + self.margin - self.band - self.noise

    @property
    def upper(self) -> float:
        """Fallback flips back to speculating above this."""
        return 1.0 + self.margin + self.band + self.noise + self.premium

    def update(
        self,
        speedup: float,
        now: float,
        evidence: float | None = None,
        *,
        cheap: bool = True,
        noise: float = 0.0,
    ) -> bool:
        """Feed one predicted speed-up; returns whether the model is speculating.
        ``evidence`` overrides the flip threshold for this update. ``cheap``: whether a flip
        now would be cheap (its drain no longer than usual); when it would not be, the flip
        waits for a cheaper moment until the evidence reaches twice the threshold, and a
        persisting edge until it has persisted twice ``persist_s``."""
        if self.last is None:
            self.last = speedup
            self.speculating = speedup > 1.0 + self.margin + self.premium  # no history: as predicted
            self.last_update = now
            return self.speculating
        # The previous prediction held since the last update: integrate its excess.
        dt = max(0.0, now - self.last_update)
        excess = self.lower - self.last if self.speculating else self.last - self.upper
        self.against = max(0.0, self.against + excess * dt)
        if not self.speculating:
            above = self.last > 1.0 + self.margin + self.premium
            self.above_s = max(0.0, self.above_s + (dt if above else -dt))
        self.last, self.last_update, self.noise = speedup, now, noise
        need = self.evidence if evidence is None else evidence
        persisted = 0.0 < self.persist_s <= self.above_s and (
            cheap or self.above_s >= self.patience * self.persist_s
        )
        if persisted or (self.against >= need and (cheap or self.against >= self.patience * need)):
            self.speculating = not self.speculating
            self.last_flip = now
            self.flips += 1
            self.against = 0.0
            self.above_s = 0.0
        return self.speculating

    def follow(self, speculating: bool) -> None:
        """Take the regime the device is in (a quiet pair routes request by request): the
        evidence to leave it starts from zero."""
        if speculating != self.speculating:
            self.speculating = speculating
            self.against = 0.0
            self.above_s = 0.0
