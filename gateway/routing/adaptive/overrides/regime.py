"""The regime's own route, when no override took the request: the mode's engine, with
the reason it is there (:class:`~gateway.routing.types.Reason`)."""

from __future__ import annotations

from gateway.routing.adaptive.estimate import Estimator
from gateway.routing.adaptive.situation import Pick, Situation
from gateway.routing.types import Reason, Route


class RegimeRoute:
    def __init__(self, estimator: Estimator) -> None:
        self.estimator = estimator

    def route(self, s: Situation) -> Pick:
        speedup = s.costs.speedup
        if s.speculating:
            if s.no_data:
                return Pick(Route.SPEC, Reason.PRIOR)
            return Pick(Route.SPEC, Reason.PREDICTED_FASTER if speedup > s.threshold else Reason.HYSTERESIS)
        if speedup > s.threshold:
            return Pick(Route.BASE, Reason.BELOW_BREAK_EVEN)  # held in fallback: not enough evidence yet
        if self.estimator.unloaded_speedup() > 1.0:
            return Pick(Route.BASE, Reason.HIGH_LOAD)  # the measured load holds it here (unloaded, spec wins)
        # acceptance holds it here: as measured, or as the prior expects
        return Pick(Route.BASE, Reason.PRIOR if s.no_data else Reason.LOW_ACCEPTANCE)
