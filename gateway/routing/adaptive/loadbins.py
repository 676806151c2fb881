"""Measurements kept per load: half-octave bins of the requests in flight, each a decayed
weighted mean of log ratios (measured ÷ modelled), read at a load through a one-octave
kernel over the bins. Shared by the latency correction (:mod:`.calibration`) and the
step-time fits (:mod:`.stepscale`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

BINS_PER_OCTAVE = 2
# Kernel weight of a bin by its distance in bins (a Gaussian of one octave's width): the
# neighbouring half-octave counts 0.88, an octave 0.61, two octaves 0.14.
_KERNEL = (*(math.exp(-0.5 * (d / BINS_PER_OCTAVE) ** 2) for d in range(12)), 0.0)


@dataclass
class Track:
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


def kernel(d: int) -> float:
    """Weight of a load bin ``d`` bins away from the one read (one octave's Gaussian)."""
    return _KERNEL[min(abs(d), len(_KERNEL) - 1)]


def bin_load(b: int) -> float:
    """The load (requests in flight) a bin starts at."""
    load: float = 2.0 ** (b / BINS_PER_OCTAVE)
    return load


def load_bin(load: float) -> int:
    """The half-octave bin of a load (requests in flight, at least 1)."""
    return round(math.log2(max(1.0, load)) * BINS_PER_OCTAVE)
