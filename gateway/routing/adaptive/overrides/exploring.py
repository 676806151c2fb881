"""The engine being explored (:mod:`..explore`) takes the request: an engine whose step
time at the load is only assumed runs there until it is measured."""

from __future__ import annotations

from gateway.routing.adaptive.situation import Pick, Situation
from gateway.routing.types import Reason


class Exploring:
    def route(self, s: Situation) -> Pick | None:
        return Pick(s.target, Reason.EXPLORE) if s.exploring else None
