"""Measured step time against the profile, per engine and per load, on one device.

Each time an engine's scraped step time is fitted (while it ran alone on the device,
:mod:`.live`), the log of measured ÷ profile is kept in the engine's half-octave load bin.
Two errors make it up, and they have different owners:

* a **common** part, the same for both engines at a load: the GPU is not the profile's
  (an H100 runs both engines 1.2-2 x slower than the H200 profile), or the profile's
  shape is off at that batch;
* the engine's **own** offset, constant across loads: a drafter dearer than the profile
  says, another vLLM version's verification cost.

Only the engine that runs is measured, and only at the load it runs at. Read naively, an
engine's latest measurement is compared with the idle engine's old one taken at another
load, or with the bare profile, and the common part is credited to the engine that ran:
on a 2 x slower GPU the pair flipped to the idle engine, and at a saturated peak the
running engine read 2.5 x while the idle one kept the 2.1 x it had shown at a batch of 10.

So an engine's scale at a load is read from both engines' measurements there: its own,
and the other's plus the offset between the two (estimated where both were measured at
neighbouring loads; zero until then, i.e. the error is taken as the device's). Far from
any measurement both shrink toward the mean of everything measured (the device factor).
Until both engines have been measured the offset is an assumption, which the policy
checks by exploring the assumed engine once (:meth:`StepScales.assumed`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gateway.routing.adaptive.knobs import knob
from gateway.routing.adaptive.loadbins import Track, kernel, load_bin


@dataclass(frozen=True, slots=True)
class StepScaleKnobs:
    max_log: float = knob(math.log(20.0), "log ratio", "a fit beyond 1/20 .. 20 x the profile is an artefact")
    kernel_floor: float = knob(
        0.02, "weight", "a measurement far away in load still says something of the device"
    )
    prior_weight: float = knob(1.0, "fits", "a load's own reading outweighs the device factor after one fit")
    near_bins: int = knob(
        2, "half-octave bins", "the engines are compared only where both ran within an octave"
    )
    near_weight: float = knob(
        0.5, "fits (decayed)", "an engine counts as measured at a load while half a recent fit weighs there"
    )


_K = StepScaleKnobs()


def _kernel(d: int, floor: float = _K.kernel_floor) -> float:
    return max(floor, kernel(d))


@dataclass
class StepScales:
    """Per engine (``spec``: True for the speculative one) and load bin, the decayed mean
    log(measured ÷ profile) step time; ``tau_s``: how long a fit is evidence."""

    tau_s: float = knob(
        300.0, "s", "a fit is evidence for a few minutes (the traffic's context moves slower)"
    )
    tracks: dict[tuple[bool, int], Track] = field(default_factory=dict)
    fits: dict[bool, int] = field(default_factory=lambda: {True: 0, False: 0})
    _cache_key: tuple[float, int, int] | None = None
    _cache: dict[tuple[bool, int], float] = field(default_factory=dict)

    def observe(self, spec: bool, load: float, ratio: float, now: float) -> None:
        """One fit: the engine's measured step time was ``ratio`` x the profile's at ``load``."""
        if not ratio > 0 or not math.isfinite(ratio):
            return
        t = self.tracks.setdefault((spec, load_bin(load)), Track())
        t.decay(now, self.tau_s)
        t.total += max(-_K.max_log, min(_K.max_log, math.log(ratio)))
        t.weight += 1.0
        t.samples += 1
        self.fits[spec] += 1

    def assumed(self, spec: bool) -> bool:
        """Whether the engine was never measured while the other was: its scale is then the
        other's (the device's), an assumption only measuring it can check."""
        return self.fits[spec] == 0 and self.fits[not spec] > 0

    def measured_near(self, spec: bool, load: float, now: float) -> bool:
        """Whether the engine was measured lately within an octave of ``load``: at least
        one recent fit's weight (decayed) in the bins there."""
        at, near = load_bin(load), _K.near_bins
        weight = 0.0
        for (s, b), t in self.tracks.items():
            if s is spec and abs(b - at) <= near:
                t.decay(now, self.tau_s)
                weight += t.weight
        return weight >= _K.near_weight

    def cheaper(self, spec: bool, now: float) -> float | None:
        """How much cheaper than the profile the engine was measured at any load: the
        largest -log(measured ÷ profile) of its load bins, 0 if it never read below the
        profile (None: never measured)."""
        if self.fits[spec] == 0:
            return None
        best = 0.0
        for (s, _), t in self.tracks.items():
            if s is spec:
                t.decay(now, self.tau_s)
                if t.weight > 0:
                    best = max(best, -t.total / t.weight)
        return best

    def _read(self, spec: bool, at: int, near: bool = False) -> tuple[float, float]:
        """(Σ kernel × total, Σ kernel × weight) of one engine's tracks around bin ``at``
        (``near``: only those within an octave)."""
        num = den = 0.0
        bins, floor = _K.near_bins, 0.0 if near else _K.kernel_floor
        for (s, b), t in self.tracks.items():
            if s is spec and (not near or abs(b - at) <= bins):
                k = _kernel(abs(b - at), floor)
                num += k * t.total
                den += k * t.weight
        return num, den

    def _offset(self, spec: bool) -> float:
        """log(engine ÷ other engine) where both were measured at neighbouring loads (0: never)."""
        num = den = 0.0
        for (s, b), t in self.tracks.items():
            if s is not spec or t.weight <= 0:
                continue
            o_num, o_den = self._read(not spec, b, near=True)
            if o_den > 0:  # a pair of readings counts as much as its weaker side
                w = min(t.weight, o_den)
                num += w * (t.total / t.weight - o_num / o_den)
                den += w
        return num / den if den > 0 else 0.0

    def log_scale(self, spec: bool, load: float, now: float) -> float:
        key = (spec, load_bin(load))
        if self._cache_key != (now, self.fits[True], self.fits[False]):
            self._cache_key = (now, self.fits[True], self.fits[False])
            self._cache.clear()
            for t in self.tracks.values():
                t.decay(now, self.tau_s)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = self._log_scale(spec, key[1])
        return hit

    def _log_scale(self, spec: bool, at: int) -> float:
        own_num, own_den = self._read(spec, at)
        oth_num, oth_den = self._read(not spec, at)
        if own_den + oth_den <= 0:
            return 0.0  # nothing measured: the profile
        off = self._offset(spec)
        # the device factor: everything measured, the other engine's shifted by the offset
        g_num = g_den = 0.0
        for (s, _), t in self.tracks.items():
            g_num += t.total + (0.0 if s is spec else off * t.weight)
            g_den += t.weight
        device = g_num / g_den if g_den > 0 else 0.0
        num = _K.prior_weight * device + own_num + oth_num + off * oth_den
        return num / (_K.prior_weight + own_den + oth_den)

    def scale(self, spec: bool, load: float, now: float) -> float:
        """The engine's step time at ``load`` ÷ the profile's (1: nothing measured)."""
        return math.exp(self.log_scale(spec, load, now))
