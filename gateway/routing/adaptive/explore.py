"""Explorations: an engine whose step time at the pair's load is only assumed is run there
once, on purpose, so that the evidence compares two measurements instead of one
measurement and an assumption.

Each engine's step time is measured only while it runs alone on the device, so only
the engine of the regime is measured, and only at the loads the regime met
(:mod:`.stepscale`). What the other engine would cost there is extrapolated: from the
device factor its partner showed, and from the offset between the two engines where
both ran at neighbouring loads. Two extrapolations can hold a pair on the wrong engine
for good, and each has its exploration:

* **plain, assumed from spec** (:meth:`Explorer.plain`): the spec engine's fit settled
  far off the profile and plain was never measured. The offset is taken as the
  device's, which keeps a pair on a slower GPU from flipping on an error common to both
  engines, but would also keep a spec engine slow for reasons of its own (a dear
  drafter) from ever being compared with plain. So the pair runs plain until plain is
  measured, once per assumption, never while spec queues (a flip would move a queue).
* **spec, at a load it never ran at** (:meth:`Explorer.spec`): the pair sits on plain at
  a load where plain was measured and spec was not (a day's peak reached in fallback).
  Spec's price there is the profile's shape scaled by what was measured elsewhere, and
  a drafter's verification at large batches is where a profile errs most. Probes cannot
  tell: they wait for an idle plain engine, and a saturated pair has none. So the pair
  runs spec until spec is measured near that load, once per load octave and retry
  period, for at most ``spec_max_s``; the evidence then decides as usual. Only where
  the step time could decide: not for traffic that accepts too little to pay at any
  step time (hot open chat behind n-gram), not where spec was measured as the profile
  says or dearer (the extrapolation is then right or flatters it), and not where spec
  never ran (nothing to extrapolate from); see
  :meth:`Explorer.spec`.

Both are bounded in time and rate: the cost of a wrong exploration is its duration on
the slower engine and two flips (the streams moved each way), per retry period, which is
why spec is explored only where its measurements give a reason (the measurements behind
these rules: docs/routing-history.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gateway.routing.adaptive.knobs import knob
from gateway.routing.adaptive.loadbins import BINS_PER_OCTAVE, load_bin
from gateway.routing.adaptive.stepscale import StepScales


@dataclass(frozen=True, slots=True)
class ExploreKnobs:
    plain_after_fits: int = knob(3, "fits", "spec's own step-time fit has settled after a few scrapes")
    plain_off: float = knob(
        0.20, "share off the profile", "another GPU reads 1.2-2 x the profile, the profile's own error ~10 %"
    )
    plain_max_s: float = knob(30.0, "s", "an exploration of plain that measured nothing by then ends")
    retry_s: float = knob(300.0, "s", "one exploration per assumption (or load octave) per retry period")
    spec_max_s: float = knob(
        15.0, "s", "a fit needs the engine alone for a scrape window (10 s) after the drain"
    )
    min_speedup: float = knob(1e-6, "speed-up", "guards the log of the headroom to spec")
    fit_noise: float = knob(
        math.log1p(0.05), "log ratio", "cheapness within 5 % of the profile is the fits' noise"
    )


@dataclass
class Explorer:
    """When an engine is being explored (see the module's docstring)."""

    knobs: ExploreKnobs = field(default_factory=ExploreKnobs)
    plain_until: float = -math.inf
    plain_on: bool = False  # plain was being explored at the last call
    plain_ended: bool = False  # ...and the last call ended it (measured, or out of time)
    spec_until: float = -math.inf
    spec_on: bool = False  # spec was being explored at the last call
    spec_ended: bool = False  # ...and the last call ended it (measured, or out of time)
    # per load octave, when spec was last explored there
    spec_tried: dict[int, float] = field(default_factory=dict)

    def plain(
        self, scales: StepScales, now: float, *, speculating: bool, queued: bool, scale_spec: float
    ) -> bool:
        """Whether the plain engine is being explored now (the pair then runs plain); when
        a call ends an exploration, ``plain_ended`` says so (the policy then goes back to
        spec unless plain now pays beyond the band: the pair was speculating, and an
        exploration measures, it does not flip: a flip left behind would hold the pair on
        the explored engine until the evidence undid it)."""
        kn = self.knobs
        if now < self.plain_until:
            on = scales.assumed(spec=False)
            if not on:
                self.plain_until = -math.inf  # measured: the evidence decides from here
        else:
            on = (
                speculating
                and not queued
                and scales.assumed(spec=False)
                and scales.fits[True] >= kn.plain_after_fits
                and abs(math.log(scale_spec)) > math.log1p(kn.plain_off)
                and now >= self.plain_until + kn.retry_s
            )
            if on:
                self.plain_until = now + kn.plain_max_s
        self.plain_ended, self.plain_on = self.plain_on and not on, on
        return on

    def spec(
        self,
        scales: StepScales,
        now: float,
        *,
        speculating: bool,
        load: float,
        could_pay: bool,
        headroom: float,
    ) -> bool:
        """Whether the spec engine is being explored now (the pair then runs spec); when a
        call ends an exploration, ``spec_ended`` says so (the policy then goes back to
        plain unless spec now pays beyond the band: an exploration measures, it does not
        flip a pair whose prediction sits inside the band, which would then hold it).

        ``could_pay``: whether the traffic's acceptance could pay for speculation at any
        step time (a spec step costs at least a plain one at the same batch, so the tokens
        a step yields bound the speed-up); if not, measuring spec decides nothing.
        ``headroom``: log(the speed-up spec must show ÷ the one predicted), how far off
        the prediction would have to be for spec to pay here (at most 0: the evidence
        takes the pair there anyway). Where spec ran, its price at another load is
        extrapolated by its measured ÷ profile ratio. A spec engine measured dearer than
        the profile at the loads it ran is taken as dearer at a larger batch too (the
        extrapolation flatters it: no need to look). One measured cheaper is explored
        only if the headroom is within how much cheaper than the profile it was seen,
        beyond the fits' noise (``fit_noise``: exploring on noise at a break-even peak
        costs more than it finds), and not by more than that: how the error changes with
        the batch differs by GPU, in both directions. One never measured is not explored
        (where it ran nowhere there is nothing to extrapolate from), nor one measured as
        the profile says.
        """
        kn = self.knobs
        if now < self.spec_until:
            on = not scales.measured_near(True, load, now)
            if not on:
                self.spec_until = -math.inf  # measured near the load: the evidence decides
        else:
            octave = load_bin(load) // BINS_PER_OCTAVE
            cheaper = scales.cheaper(True, now)
            on = (
                not speculating
                and could_pay
                and headroom > 0.0
                and cheaper is not None
                and headroom <= cheaper - kn.fit_noise
                and scales.measured_near(False, load, now)
                and not scales.measured_near(True, load, now)
                and now >= self.spec_tried.get(octave, -math.inf) + kn.retry_s
            )
            if on:
                self.spec_tried[octave] = now
                self.spec_until = now + kn.spec_max_s
        self.spec_ended, self.spec_on = self.spec_on and not on, on
        return on
