"""A pair shared with others: what the device runs beyond this gateway replica's requests.

Gateway replicas in front of the same pair each count only their own requests in flight;
the engines' scraped gauges (``running`` + ``waiting``) count everybody's. The difference
is the others' load on each engine (*foreign*), as of the last scrape: the evidence the
replicas agree through, with no channel between them. When the others run the regime a
replica is not in, the pair is split and every request waits for both engines' steps,
which costs far more than either regime's edge near break-even.

So on a shared pair (others' requests seen within the last minute) plain is the regime
replicas meet on, and speculation must be decisive:

- each replica's own evidence takes it to spec only beyond a premium (``SHARED_PREMIUM``,
  which the policy sets as :attr:`~gateway.routing.adaptive.modes.ModeTracker.premium`,
  on top of the margin: with the default margin, spec must then be predicted 22 % faster
  to come back): replicas see
  the same engines and nearly the same traffic, so a decisive change flips them within
  seconds of each other, while a marginal one flips none;
- a replica speculating while others still run plain gives up after one request
  duration (the others' own flips, and its old engine's drain, take about that), and does
  not try again for a back-off that doubles with each failed try (10 s up to 160 s);
- a replica in fallback while the others run spec and nobody else plain follows them
  (its streams move as at any flip), so one replica's decisive flip to spec carries the
  others within a scrape; unless it left spec on its own evidence within the last
  ``_LEAD_HOLD_DURATIONS`` request durations (then the others' grace brings them to plain,
  and the two do not chase each other). With more than one other replica a lone leader
  rarely finds nobody else on plain: there the premium, and every replica's own evidence,
  still decide;
- requests are routed by the regime, not one by one: choosing per request needs to know
  what the device runs right now, which a shared pair shows only through scrapes up to a
  second old.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Reversible
from dataclasses import dataclass

from gateway.routing.types import EngineView, Route

SHARED_PREMIUM = 0.15  # extra predicted speed-up spec needs on a pair shared with others
_OWN_HORIZON_S = 30.0  # own in-flight counts kept this long (older scrapes are stale)
_SHARED_HOLD_S = 60.0  # a pair where others' requests were seen counts as shared this long
# how long an engine may still count a request this replica stopped relaying (vLLM aborts
# it at its next step; a step at a saturated batch with prefill runs up to tens of ms)
_ABORT_LAG_S = 1.0
_GRACE_DURATIONS = 1.0  # how long a replica speculating alone waits for the others
_BACKOFF_S = (10.0, 160.0)  # back-off after a failed try at spec: first, longest
# A replica that left spec on its own evidence does not follow the others back to it for
# this many request durations: their own evidence, or their grace, takes them to plain.
_LEAD_HOLD_DURATIONS = 3.0


@dataclass(frozen=True, slots=True)
class DeviceView:
    """What the device runs: this replica's requests, or others' seen in the scrape."""

    foreign_spec: float
    foreign_base: float
    runs_spec: bool
    runs_base: bool

    @property
    def split(self) -> bool:
        return self.runs_spec and self.runs_base


class SharedPair:
    def __init__(self) -> None:
        # per pair (its engines' names): (time, this replica's requests on spec, on base)
        # after each decision
        self._own: dict[tuple[str, str], deque[tuple[float, int, int]]] = {}
        self._shared_until = -math.inf
        self._alone_since = math.inf  # speculating while others run plain, since
        self._held_since = math.inf  # speculating with nobody on plain, since
        self._backoff = _BACKOFF_S[0]
        self.blocked_until = -math.inf  # no try at spec before this (after a failed one)

    def view(self, spec: EngineView, base: EngineView, now: float) -> DeviceView:
        own = self._own.get((spec.name, base.name), ())
        fs, fb = _foreign(spec, own), _foreign(base, own)
        if max(fs, fb) >= 1.0:
            self._shared_until = now + _SHARED_HOLD_S
        return DeviceView(fs, fb, spec.inflight > 0 or fs >= 1.0, base.inflight > 0 or fb >= 1.0)

    def shared(self, now: float) -> bool:
        """Whether others' requests were seen on the pair lately (module doc)."""
        return now < self._shared_until

    def record(self, now: float, spec: EngineView, base: EngineView, route: Route) -> None:
        """This replica's counts once the request is sent."""
        own = self._own.setdefault((spec.name, base.name), deque(maxlen=4096))
        own.append((now, spec.inflight + (route is Route.SPEC), base.inflight + (route is Route.BASE)))
        while own and own[0][0] < now - _OWN_HORIZON_S:
            own.popleft()

    @staticmethod
    def join_spec(
        device: DeviceView, *, speculating: bool, last_flip: float, duration_s: float, now: float
    ) -> bool:
        """Whether a replica in fallback follows the others to spec: they run spec and
        nobody else plain (a split costs every request both engines' steps), and its own
        last flip is older than the hold (module doc)."""
        return (
            not speculating
            and device.foreign_spec >= 1.0
            and device.foreign_base < 1.0
            and now - last_flip > _LEAD_HOLD_DURATIONS * duration_s
        )

    def back_to_plain(self, device: DeviceView, *, speculating: bool, duration_s: float, now: float) -> bool:
        """Whether a speculating replica gives up on spec: others have run plain for longer
        than the grace period (module doc)."""
        alone = speculating and device.foreign_base >= 1.0
        if not alone:
            self._alone_since = math.inf
            if speculating:  # spec holds with everyone: a later failed try starts afresh
                self._held_since = min(self._held_since, now)
                if now - self._held_since > _BACKOFF_S[1]:
                    self._backoff = _BACKOFF_S[0]
            else:
                self._held_since = math.inf
            return False
        self._held_since = math.inf
        self._alone_since = min(self._alone_since, now)
        if now - self._alone_since <= _GRACE_DURATIONS * duration_s:
            return False
        self._alone_since = math.inf
        self.blocked_until = now + self._backoff
        self._backoff = min(_BACKOFF_S[1], 2.0 * self._backoff)
        return True


def _foreign(e: EngineView, own: Reversible[tuple[float, int, int]]) -> float:
    """Requests on an engine that are not this replica's, as of its last scrape. This
    replica's own count at the scrape is bounded by the most it had there since the
    decision before the scrape, so its requests that finished since are not read as
    someone else's; nor are those it stopped relaying within ``_ABORT_LAG_S`` before the
    scrape (a flip's moved streams: read as another replica's, they made the pair
    "shared" for a minute after every flip on a real H200)."""
    st = e.stats
    if e.stale or st.running is None:
        return 0.0
    col = 1 if e.route is Route.SPEC else 2
    mine = float(e.inflight)
    for rec in reversed(own):
        mine = max(mine, float(rec[col]))
        if rec[0] <= st.at:
            break
    # and those it stopped relaying just before the scrape, which the engine still counted
    mine += sum(1 for t in e.closed_at if st.at - _ABORT_LAG_S <= t <= st.at)
    return st.running + (st.waiting or 0.0) - mine
