"""The handover: after a flip, new requests still join the old engine while it finishes
its last request.

A flip costs its drain: while the old engine still runs requests, every new one on the
other engine waits for both engines' steps. When the old engine is down to its last
request it is about to idle, and the flip is then nearly free: new requests keep going to
it until it is idle, for at most one mean request duration. With more in flight, feeding
it would only stretch the drain by a new request's whole life, so the switch is made at
once. A flip that moves the old engine's streams (``move_on_flip``) empties it at once:
nothing is handed over.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.routing.adaptive.knobs import knob
from gateway.routing.adaptive.situation import Pick, Situation
from gateway.routing.types import Reason, Route


@dataclass(frozen=True, slots=True)
class HandoverKnobs:
    max_inflight: int = knob(
        1, "requests", "hand over only to an old engine about to idle (its last request)"
    )


class Handover:
    """Where the regime's traffic flows (lags a flip by the handover)."""

    def __init__(self, knobs: HandoverKnobs | None = None) -> None:
        self.knobs = knobs or HandoverKnobs()
        self.routing: Route | None = None

    def route(self, s: Situation) -> Pick | None:
        target = s.target
        if s.moving or self.routing is None or self.routing is target:
            self.routing = target
            return None
        old = s.pair.speculative if self.routing is Route.SPEC else s.pair.base
        about_to_idle = 0 < old.inflight <= self.knobs.max_inflight
        if not about_to_idle or s.now - s.last_flip >= s.duration_s or not old.usable:
            self.routing = target
            return None
        return Pick(target.other, Reason.HANDOVER)
