"""The quiet pair: so few requests in flight that the pair idles between them.

Then a request that finds the pair idle takes the engine fastest for itself, and one that
finds one engine running joins it (a split would make both pay both engines' steps); the
regime is whatever the device runs. Quiet is measured, not predicted: the mean number in
flight that arrivals find (Poisson arrivals see the time average, λ·D), over about the
last ten arrivals, with hysteresis so that a load near the edge does not toggle it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.routing.adaptive.knobs import knob
from gateway.routing.adaptive.situation import Pick, Situation
from gateway.routing.types import Reason, Route


@dataclass(frozen=True, slots=True)
class QuietKnobs:
    enter: float = knob(1.5, "requests in flight", "at most this many, the pair idles often enough")
    leave: float = knob(3.0, "requests in flight", "hysteresis: well above enter, a burst does not toggle it")
    smoothing: float = knob(0.1, "weight per arrival", "about the last ten arrivals")
    idle_premium: float = knob(
        0.05,
        "speed-up",
        "a request alone on the pair takes spec only if 5 % faster for it (the model's error)",
    )


class QuietPair:
    """Whether the pair is quiet, and the route of a request on a quiet pair."""

    def __init__(self, knobs: QuietKnobs | None = None) -> None:
        self.knobs = knobs or QuietKnobs()
        self.quiet = True
        self.busy = 0.0  # mean requests in flight that arrivals find

    def observe(self, in_flight: float) -> bool:
        """An arrival found ``in_flight`` requests on the pair; returns whether it is quiet."""
        kn = self.knobs
        self.busy += kn.smoothing * (in_flight - self.busy)
        if self.quiet and self.busy > kn.leave:
            self.quiet = False
        elif not self.quiet and self.busy <= kn.enter:
            self.quiet = True
        return self.quiet

    def route(self, s: Situation) -> Pick | None:
        if not s.quiet or s.device.split:
            return None
        if s.device.runs_spec or s.device.runs_base:  # one engine running: join it
            return Pick(
                Route.SPEC if s.device.runs_spec else Route.BASE, Reason.JOIN_RUNNING, sets_regime=True
            )
        # both idle: the engine fastest for this request
        route = Route.SPEC if s.own_speedup > 1.0 + self.knobs.idle_premium else Route.BASE
        return Pick(route, Reason.PRIOR if s.no_data else Reason.IDLE_PAIR, sets_regime=True)
