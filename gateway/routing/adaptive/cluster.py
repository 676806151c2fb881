"""Other gateway replicas in front of the same pair: heard over the peer channel, or
inferred from the engines' scrapes.

* **Peers** (:mod:`gateway.peers`): the others' requests arrive as witnesses and are
  priced as this replica's, and a leader's regime is followed (this replica then does
  not run its own evidence switch). The channel counts as live for ``peer_hold_s``
  after anything was heard.
* **A shared pair** without a channel (:mod:`.shared`): the scrapes show requests beyond
  this replica's own. Plain is then the regime replicas meet on: spec needs a premium,
  a replica alone on spec comes back (and backs off), one alone on plain follows the
  others to spec. These are proposals: :class:`~.controller.RegimeController` applies them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.routing.adaptive.knobs import knob
from gateway.routing.adaptive.shared import DeviceView, SharedPair
from gateway.routing.types import EngineView


@dataclass(frozen=True, slots=True)
class ClusterKnobs:
    peer_hold_s: float = knob(
        10.0, "s", "a peer heard from within this long makes the channel live (several messages a second)"
    )


class Cluster:
    """What this replica knows of the others (module doc)."""

    def __init__(self, knobs: ClusterKnobs | None = None, pair: SharedPair | None = None) -> None:
        self.knobs = knobs or ClusterKnobs()
        self.pair = pair or SharedPair()  # other replicas' requests seen in the scrapes
        # the regime the cluster's leader published (None: this replica decides it), and
        # whether it finds the pair quiet
        self.leader_mode: bool | None = None
        self.leader_quiet: bool | None = None
        self._peered_until = -math.inf

    @property
    def following(self) -> bool:
        """Whether a leader's regime is followed (this replica's evidence then waits)."""
        return self.leader_mode is not None

    def heard(self, now: float) -> None:
        """A peer spoke (a witnessed request, a leader's regime)."""
        self._peered_until = now + self.knobs.peer_hold_s

    def peered(self, now: float) -> bool:
        """Whether a peer channel shows the other replicas' requests (lately heard)."""
        return now < self._peered_until

    def shared(self, now: float) -> bool:
        """Whether the pair is shared with replicas this one does not hear from: then the
        engines' scrapes are the only evidence of them (:mod:`.shared`)."""
        return self.pair.shared(now) and not self.peered(now)

    def device(self, spec: EngineView, base: EngineView, now: float) -> DeviceView:
        """What the device runs, this replica's requests and the others' (from the scrapes)."""
        return self.pair.view(spec, base, now)

    def premium(self, shared: bool) -> float:
        """The extra speed-up spec must clear: on a shared pair, the shared premium."""
        return self.pair.knobs.premium if shared else 0.0

    def quiet(self, own: bool) -> bool:
        """Whether the pair counts as quiet: the leader's view while following one (quiet
        and busy replicas would split the pair), else this replica's own (``own``)."""
        if self.leader_mode is not None and self.leader_quiet is not None:
            return self.leader_quiet
        return own

    def follow(self, speculating: bool | None, now: float, quiet: bool | None) -> None:
        """The leader's regime (None: no leader) and whether it finds the pair quiet."""
        self.leader_quiet = quiet if speculating is not None else None
        if speculating is not None:
            self.heard(now)
        self.leader_mode = speculating

    def proposal(
        self,
        device: DeviceView,
        *,
        speculating: bool,
        was: bool,
        last_flip: float,
        duration_s: float,
        now: float,
    ) -> bool | None:
        """The regime a shared pair asks for (None: none): no try at spec during a
        back-off, back to plain when the others stay there, to spec when they all run it.
        Nothing to infer where the peers' channel shows the whole cluster's requests."""
        if self.peered(now):
            return None
        tried_early = speculating and not was and now < self.pair.blocked_until
        if tried_early or self.pair.back_to_plain(
            device, speculating=speculating, duration_s=duration_s, now=now
        ):
            return False
        if self.shared(now) and self.pair.join_spec(
            device, speculating=speculating, last_flip=last_flip, duration_s=duration_s, now=now
        ):
            return True
        return None
