"""Probes: in fallback, a bounded share of requests measures spec.

While in fallback the spec engine sees none of the traffic, so nothing measures whether
acceptance recovered. :class:`Prober` sends a bounded share of eligible requests
(deterministically every ⌈1/share⌉-th) and at least one per ``interval_s`` to spec. A
probe wakes the spec engine, which slows every request on the device while it runs (each
cycle steps both engines), so a request is eligible only when the plain engine is idle,
when it is short and would show whether speculation pays, and when fully recovered
acceptance would bring the pair back to spec (otherwise a probe could change no decision).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.routing.adaptive.estimate import Estimator
from gateway.routing.adaptive.knobs import knob
from gateway.routing.adaptive.situation import Pick, Situation
from gateway.routing.config import RoutingConfig
from gateway.routing.types import Reason, Route


@dataclass(frozen=True, slots=True)
class ProbeKnobs:
    min_tokens_per_step: float = knob(
        1.5, "tokens per step", "a request that accepts less would not show whether speculation pays"
    )


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


class Probe:
    """The probe override (module doc)."""

    def __init__(self, cfg: RoutingConfig, estimator: Estimator, knobs: ProbeKnobs | None = None) -> None:
        self.knobs = knobs or ProbeKnobs()
        self.prober = Prober(cfg.probe_share, cfg.probe_interval_s)
        self.max_tokens = cfg.probe_max_tokens
        self.estimator = estimator

    def arm(self, now: float) -> None:
        """The first policy decision starts the probe interval."""
        if self.prober.last_probe == -math.inf:
            self.prober.last_probe = now

    def route(self, s: Situation) -> Pick | None:
        if s.speculating or s.following:  # a follower's leader probes for the cluster
            return None
        f = s.features
        short = f.max_tokens is not None and f.max_tokens <= self.max_tokens
        if not (short and s.request.blended >= self.knobs.min_tokens_per_step and not s.device.runs_base):
            return None
        recovered = self.estimator.speedup_at_full_acceptance(s.load)
        if recovered is None or recovered <= s.upper or not self.prober.should_probe(s.now):
            return None
        return Pick(Route.SPEC, Reason.PROBE, probe=True)
