"""What the per-request overrides (:mod:`.overrides`) read: one request's situation once
the regime is settled, and what an override returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from gateway.routing.adaptive.costmodel import RegimeCosts
from gateway.routing.adaptive.estimate import RequestEstimate
from gateway.routing.adaptive.shared import DeviceView
from gateway.routing.types import PairView, Reason, RequestFeatures, Route


@dataclass(slots=True)
class Situation:
    """One request's situation, built once per decision (read-only by convention: the
    overrides read it, none writes it)."""

    features: RequestFeatures
    pair: PairView
    now: float
    request: RequestEstimate  # its tokens per step (prior, learned, live-corrected)
    device: DeviceView  # what the device runs (this replica's requests and others')
    costs: RegimeCosts  # both regimes at the load the request finds
    load: float  # that load (the batch it makes)
    speculating: bool  # the regime, as the controller settled it
    target: Route  # the regime's engine
    last_flip: float  # when the regime last flipped
    quiet: bool  # the pair idles between requests (and is not shared)
    following: bool  # a cluster leader's regime is followed
    exploring: bool  # an engine is being explored
    moving: bool  # the regime flipped now and the old engine's streams move
    own_speedup: float  # this request's predicted speed-up on spec
    decode_ms: float  # its decoding time per token on spec, as predicted
    no_data: bool  # nothing learned or measured yet: the prior decides
    threshold: float  # 1 + margin: where spec is predicted faster enough
    upper: float  # the speed-up that flips fallback to spec
    duration_s: float  # mean request duration


@dataclass(frozen=True, slots=True)
class Pick:
    """An override's route. ``sets_regime``: the regime is now the engine the request runs
    on (a quiet pair follows its device)."""

    route: Route
    reason: Reason
    probe: bool = False
    sets_regime: bool = False


class Override(Protocol):
    """A per-request override: a route, or None to leave the request to the next part."""

    def route(self, s: Situation) -> Pick | None: ...
