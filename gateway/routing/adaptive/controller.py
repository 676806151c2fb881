"""The regime controller: the one place that sets the pair's mode.

Step 2 of the policy's pipeline (:mod:`.policy`). The pair runs one regime at a time,
*speculating* (traffic on the spec engine) or *fallback* (on plain, but for probes),
because on a shared device a split makes every request wait for both engines' steps.
The controller owns that mode (:class:`~.modes.ModeTracker`) and the exploration that
keeps evidence about the regime not running (:class:`~.explore.Explorer`). Other parts
only *propose* a regime; the controller applies, per decision, in this order:

1. **evidence** (:meth:`weigh`): the predicted speed-up's excess beyond
   ``1 + margin ± (hysteresis + noise)``, integrated over time, flips the mode once it
   pays for one drain (``switch_evidence`` × the drain), at a cheap moment (the old
   engine runs no more than arrivals usually find, and does not queue) or once the
   evidence is ``patience`` times that; in fallback a prediction above ``1 + margin``
   for ``persist_s`` on balance flips it too. Not while a cluster leader's regime is
   followed;
2. **the shared pair** (:mod:`.cluster`): replicas that see each other only through the
   scrapes meet on plain, and follow a decisive leader to spec;
3. **exploration** (:meth:`explore`): an engine whose step time at the load is only
   assumed runs there once, and when that ends the pair goes back unless the evidence
   now pays for staying;
4. **the quiet pair** (:mod:`.overrides.quiet`): on a pair that idles between requests,
   the regime is whatever the device runs.

A cluster leader's word (:meth:`follow_leader`) arrives between decisions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.routing.adaptive.explore import Explorer
from gateway.routing.adaptive.knobs import knob
from gateway.routing.adaptive.modes import ModeTracker
from gateway.routing.adaptive.stepscale import StepScales
from gateway.routing.config import RoutingConfig


@dataclass(frozen=True, slots=True)
class ControllerKnobs:
    """The switch's own tunables are the operator's (``margin``, ``hysteresis``,
    ``switch_evidence``, ``persist_s``, ``noise_z`` in
    :class:`~gateway.routing.config.RoutingConfig`); this is the rest."""

    patience: float = knob(
        2.0, "x the evidence a flip needs", "a flip at a busy moment waits for a cheap one, but not forever"
    )


class RegimeController:
    """The pair's mode, the evidence switch and exploration (module doc)."""

    def __init__(
        self, cfg: RoutingConfig, knobs: ControllerKnobs | None = None, explorer: Explorer | None = None
    ) -> None:
        self.knobs = knobs or ControllerKnobs()
        self.mode = ModeTracker(
            cfg.margin,
            cfg.hysteresis,
            cfg.switch_evidence,
            persist_s=cfg.persist_s,
            patience=self.knobs.patience,
        )
        self.explorer = explorer or Explorer()
        self.switch_evidence = cfg.switch_evidence

    @property
    def speculating(self) -> bool:
        return self.mode.speculating

    def weigh(
        self,
        speedup: float,
        now: float,
        *,
        loads: tuple[float, float],
        queued: tuple[bool, bool],
        busy: float,
        drain_s: float,
        noise: float,
    ) -> None:
        """1. Feed the predicted speed-up at the load a request found (``loads``: on the
        spec and the plain engine; ``queued``: whether each queues; ``busy``: requests in
        flight that arrivals usually find). A flip leaves the old engine's requests running
        beside the new one's: it is cheap when the old engine runs no more than usual and
        does not queue (moving a queue re-prefills a whole batch on the new engine)."""
        old = loads[0] if self.mode.speculating else loads[1]
        old_queued = queued[0] if self.mode.speculating else queued[1]
        cheap = old <= max(1.0, busy) and not old_queued
        evidence = self.switch_evidence * drain_s
        self.mode.update(speedup, now, evidence, cheap=cheap, noise=noise)

    def premium(self, premium: float) -> None:
        """The extra speed-up spec must clear (a shared pair's, :mod:`.cluster`)."""
        self.mode.premium = premium

    def propose(self, speculating: bool | None) -> None:
        """2./4. Take a part's proposal (None: none): the evidence to leave it starts at zero."""
        if speculating is not None:
            self.mode.follow(speculating)

    def explore(
        self,
        scales: StepScales,
        now: float,
        *,
        active: bool,
        speedup: float,
        load: float,
        queued: bool,
        scale_spec: float,
        mix_tokens_per_step: float,
    ) -> bool:
        """3. Whether an engine is being explored now (the mode is then its engine's).
        ``active``: whether exploring may start or go on (not on a quiet or shared pair, nor
        while a leader's regime is followed). An exploration measures, it does not flip:
        when one ends, the pair goes back unless the prediction now pays beyond the band."""
        x, mode = self.explorer, self.mode
        explored: bool | None = None
        if active:
            if x.plain(scales, now, speculating=mode.speculating, queued=queued, scale_spec=scale_spec):
                explored = False
            elif x.spec(
                scales,
                now,
                speculating=mode.speculating,
                load=load,
                could_pay=mix_tokens_per_step > mode.upper,
                headroom=math.log(mode.upper / max(speedup, x.knobs.min_speedup)),
            ):
                explored = True
        if explored is not None:
            mode.follow(explored)
        elif x.spec_ended and mode.speculating and speedup <= mode.upper:
            x.spec_ended = False  # measured: back to plain unless spec now pays
            mode.follow(False)
        elif x.plain_ended and not mode.speculating and speedup >= mode.lower:
            x.plain_ended = False  # measured: back to spec unless plain now pays
            mode.follow(True)
        return explored is not None

    def follow_leader(self, speculating: bool, now: float) -> None:
        """A cluster leader's regime: taken at once, as a flip of this replica's own."""
        if speculating != self.mode.speculating:
            self.mode.follow(speculating)
            self.mode.last_flip = now
