"""Measured latency against the model: how far the model is off, per engine and per load.

The cost model predicts each request's time per output token on the engine it is sent to
(step times from the calibration profile at the pair's load, tokens per step from the
request's class). The gateway then measures what the request actually got. Part of the
gap is common to both engines (the profile read at the wrong context length, host
overheads, a load the profile prices wrong for any engine): plain decoding is the same
physics on either engine, so the plain engine's gap at a load is that common part. What
the speculative engine shows beyond it (acceptance, drafts, verification cost, at the
current load and temperature) is speculation's own error, and the spec regime's cost is
scaled by it: at high load or high temperature the model can be off by as much as the two
regimes differ, and only measurement can tell. But only the engine that runs is
measured: where plain was not measured at the load spec runs at, spec's gap is taken as
common, less the offset between the engines measured where both ran
(:meth:`LatencyBias.relative`). Each flip measures the new engine at the load the old one
ran at, which is how the offset is learned.

The error depends on the load: a profile can price verification right for a batch of
four and wrong for a batch of sixty-four, and a load-blind correction learned at light
load would then misprice the peak. So measurements are kept
per load (half-octave bins of the requests in flight the request found) and read through
a one-octave kernel: the error at a load is what was measured there and nearby, and at a
load never measured it is what was measured at the nearest loads, shrunk toward the model.

Only clean measurements count: a request decided while the other engine of the pair was
busy shared the device with it (it waited for both engines' steps), and a probe ran beside
the other regime; the policy hands back no prediction for those. A request that queued
counts: time per output token starts at its first token, so the queue is not in it, and
the batch it ran in is the engine's cap, which is what the model prices. A gap is evidence
about the traffic and load it was measured on: an engine that serves nothing is no longer
measured, and its estimate relaxes to zero (the model) as its measurements age.

A gap is what the model gets wrong beyond what the live corrections measure
(:mod:`.live`): the engine's step time, and for spec the traffic's acceptance. A request
is priced with the corrections of the moment it arrives, and they lag (a day's first
requests are priced with the prior's acceptance and an unfitted step time); a gap learned
from them would count the corrections' error a second time once they caught up. So a
gap is re-priced when the request finishes: its prediction is shifted by the corrections
it was priced with ÷ those measured over its life (the scraped acceptance of the window it
ran in, its engine's fitted step time), and what the corrections measure is never
counted twice, whether they were still converging or the traffic's acceptance moved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gateway.routing.adaptive.knobs import REPORT_DIGITS, knob
from gateway.routing.adaptive.loadbins import Track, bin_load, kernel, load_bin
from gateway.routing.types import Route


@dataclass(frozen=True, slots=True)
class CalibrationKnobs:
    max_log_ratio: float = knob(
        1.0, "log ratio", "one request off by more than e x is clipped (a stall, not a price)"
    )
    min_tokens: int = knob(16, "tokens", "shorter answers give too noisy a time per token")
    shown_weight: float = knob(
        0.5, "requests (decayed)", "/admin/state lists the load bins that weigh this much"
    )


_K = CalibrationKnobs()
LOAD_DIGITS, WEIGHT_DIGITS = 1, 2  # decimals /admin/state shows loads and weights with


@dataclass
class LatencyBias:
    """Per engine and load bin, the mean log(measured ÷ modelled) time per token of the
    requests of the last ``tau_s`` seconds (exponentially weighted); read at a load through
    a kernel over the bins and shrunk toward 0 by ``prior_weight`` pseudo-requests: a few
    requests barely move it, a steady stream sets it, and once an engine serves nothing
    its weight decays and the estimate returns to the model."""

    tau_s: float = knob(
        30.0, "s", "the error of the last half-minute's requests: follows a load or traffic change"
    )
    prior_weight: float = knob(
        10.0, "requests", "a few requests barely move the correction, a steady stream sets it"
    )
    tracks: dict[tuple[Route, int], Track] = field(default_factory=dict)
    samples: dict[Route, int] = field(default_factory=lambda: dict.fromkeys(Route, 0))

    def _near(self, route: Route, now: float, at: int | None) -> tuple[float, float]:
        """(Σ kernel × total, Σ kernel × weight) of an engine's tracks around bin ``at``
        (None: every load alike)."""
        num = den = 0.0
        for (r, b), t in self.tracks.items():
            if r is not route:
                continue
            t.decay(now, self.tau_s)
            k = 1.0 if at is None else kernel(b - at)
            num += k * t.total
            den += k * t.weight
        return num, den

    def log_bias(self, route: Route, now: float, load: float | None = None) -> float:
        """The engine's own measured log error at ``load`` (None: over every load alike),
        shrunk toward the model."""
        num, den = self._near(route, now, None if load is None else load_bin(load))
        w = den + self.prior_weight
        return num / w if w > 0 else 0.0

    def _offset(self, now: float) -> float:
        """log(spec's error ÷ plain's) where both engines were measured at the same loads,
        shrunk toward 0: speculation's own error, the part a load where plain did not run
        still shows."""
        num = den = 0.0
        for (r, b), t in list(self.tracks.items()):
            if r is not Route.SPEC:
                continue
            t.decay(now, self.tau_s)
            b_num, b_den = self._near(Route.BASE, now, b)
            if t.weight > 0 and b_den > 0:
                w = min(t.weight, b_den)
                num += w * (t.total / t.weight - b_num / b_den)
                den += w
        return num / (den + self.prior_weight) if den + self.prior_weight > 0 else 0.0

    def relative(self, now: float, load: float) -> float:
        """log of what the spec engine adds to the model's error at ``load``, beyond the
        part common to both engines.

        Only the engine that runs is measured, and an error common to both (the device,
        a load the profile prices wrong for every engine) would be credited to it alone:
        at a saturated peak spec's requests ran 19 % over the model, the pair flipped to
        plain, and plain then ran 39 % over it. So spec's error counts as its own only as
        far as plain was measured at the same load (both weights ``w/(w + prior)``); the
        rest is taken as common, less the offset between the engines measured at the
        loads where both ran."""
        at = load_bin(load)
        s_num, s_den = self._near(Route.SPEC, now, at)
        b_num, b_den = self._near(Route.BASE, now, at)
        off = self._offset(now)
        if s_den <= 0 or b_den <= 0:
            return off
        p = self.prior_weight
        both = (s_den / (s_den + p)) * (b_den / (b_den + p))
        return off + both * (s_num / s_den - b_num / b_den - off)

    def factor(self, route: Route, now: float, load: float | None = None) -> float:
        """Measured ÷ modelled time per token at ``load`` (1 = the model is right): for the
        speculative engine what it adds beyond the common part (:meth:`relative`), for the
        plain engine its own measured error (shown, not priced)."""
        if route is Route.SPEC and load is not None:
            return math.exp(self.relative(now, load))
        return math.exp(self.log_bias(route, now, load))

    def observe(
        self,
        route: Route,
        measured_s: float,
        predicted_s: float,
        tokens: int,
        now: float,
        load: float = 1.0,
        repriced: float = 0.0,
    ) -> bool:
        """Fold one finished request in (``load``: the requests in flight it found;
        ``repriced``: log of the live corrections its prediction was priced with ÷ those
        measured over its life, see the module's docstring); False when it is not a usable
        measurement."""
        if tokens < _K.min_tokens or not (measured_s > 0 and predicted_s > 0):
            return False
        r = math.log(measured_s / predicted_s) + (repriced if math.isfinite(repriced) else 0.0)
        t = self.tracks.setdefault((route, load_bin(load)), Track())
        t.decay(now, self.tau_s)
        t.total += max(-_K.max_log_ratio, min(_K.max_log_ratio, r))
        t.weight += 1.0
        t.samples += 1
        self.samples[route] += 1
        return True

    def snapshot(self, now: float) -> dict[str, object]:
        out: dict[str, object] = {}
        for r in Route:
            bins = sorted((b, t) for (rr, b), t in self.tracks.items() if rr is r)
            out[r.value] = {
                "factor": round(self.factor(r, now), REPORT_DIGITS),
                "samples": self.samples[r],
                # per load bin with live weight: the load it starts at, its factor, its weight
                "by_load": [
                    {
                        "load": round(bin_load(b), LOAD_DIGITS),
                        "factor": round(self.factor(r, now, bin_load(b)), REPORT_DIGITS),
                        "weight": round(t.weight, WEIGHT_DIGITS),
                    }
                    for b, t in bins
                    if t.weight >= _K.shown_weight
                ],
            }
        return out
