"""Measured latency against the model: how far the speculative engine's model is off.

The cost model predicts each request's time per output token on the engine it is sent to
(step times from the calibration profile at the pair's load, tokens per step from the
request's class). The gateway then measures what the request actually got. Part of the
gap is common to both engines (the profile read at the wrong context length, host
overheads): plain decoding is the same physics on either
engine, so the plain engine's gap is taken as that common part. What remains on the
speculative engine (acceptance, drafts, verification cost, all of it at the current load
and temperature) is speculation's own error, and the spec regime's cost is scaled by it:
at high load or high temperature the model can be off by as much as the two regimes
differ, and only measurement can tell.

Only clean measurements count: a request decided while the other engine of the pair was
busy shared the device with it (it waited for both engines' steps), and one decided while
its engine had a queue measures that engine's prefill and queue, which would weigh on
either engine alike; the policy hands back no prediction for those. A gap is evidence
about the traffic and load it was measured on: an engine that serves nothing is no longer
measured, and its estimate relaxes to zero (the model) as its measurements age.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gateway.routing.types import Route

_MAX_LOG_RATIO = 1.0  # one request's log ratio is clipped to ±1
_MIN_TOKENS = 16  # shorter answers give too noisy a time per token


@dataclass
class _Track:
    weight: float = 0.0  # Σ of the decayed weights of the measurements
    total: float = 0.0  # Σ weight × log(measured / modelled)
    at: float | None = None
    samples: int = 0

    def decay(self, now: float, tau_s: float) -> None:
        if self.at is not None and now > self.at:
            f = math.exp(-(now - self.at) / tau_s)
            self.weight *= f
            self.total *= f
        self.at = now if self.at is None else max(self.at, now)


@dataclass
class LatencyBias:
    """Per engine, the mean log(measured ÷ modelled) time per token of the requests of the
    last ``tau_s`` seconds (exponentially weighted), shrunk toward 0 by ``prior_weight``
    pseudo-requests: a few requests barely move it, a steady stream sets it, and once an
    engine serves nothing its weight decays and the estimate returns to the model."""

    tau_s: float = 30.0
    prior_weight: float = 10.0
    tracks: dict[Route, _Track] = field(default_factory=lambda: {r: _Track() for r in Route})

    def log_bias(self, route: Route, now: float) -> float:
        t = self.tracks[route]
        t.decay(now, self.tau_s)
        w = t.weight + self.prior_weight
        return t.total / w if w > 0 else 0.0

    def factor(self, route: Route, now: float) -> float:
        """Measured ÷ modelled time per token on ``route`` (1 = the model is right): for
        the plain engine the common part, for the speculative engine what it adds."""
        return math.exp(self.log_bias(route, now))

    def observe(self, route: Route, measured_s: float, predicted_s: float, tokens: int, now: float) -> bool:
        """Fold one finished request in; False when it is not a usable measurement."""
        if tokens < _MIN_TOKENS or not (measured_s > 0 and predicted_s > 0):
            return False
        r = math.log(measured_s / predicted_s)
        if route is Route.SPEC:
            r -= self.log_bias(Route.BASE, now)  # the common part, as the plain engine shows it
        t = self.tracks[route]
        t.decay(now, self.tau_s)
        t.total += max(-_MAX_LOG_RATIO, min(_MAX_LOG_RATIO, r))
        t.weight += 1.0
        t.samples += 1
        return True

    def snapshot(self, now: float) -> dict[str, object]:
        return {
            r.value: {"factor": round(self.factor(r, now), 4), "samples": self.tracks[r].samples}
            for r in Route
        }
