"""A pair shared with others: what the device runs beyond this gateway replica's requests.

Gateway replicas in front of the same pair each count only their own requests in flight;
the engines' scraped gauges (``running`` + ``waiting``) count everybody's. The difference
is the others' load on each engine (*foreign*), as of the last scrape: the evidence the
replicas agree through, with no channel between them. When the others run the regime a
replica is not in, the pair is split and every request waits for both engines' steps,
which costs far more than either regime's edge near break-even.

So on a shared pair (others' requests seen within the last minute) plain is the regime
replicas meet on, and speculation must be decisive:

- each replica's own evidence takes it to spec only beyond a premium (``premium``,
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
  ``lead_hold_durations`` request durations (then the others' grace brings them to plain,
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

from gateway.routing.adaptive.knobs import knob
from gateway.routing.types import EngineView, Route


@dataclass(frozen=True, slots=True)
class SharedKnobs:
    premium: float = knob(
        0.15, "speed-up", "replicas flip to spec together only on a decisive change, none on a marginal one"
    )
    own_horizon_s: float = knob(
        30.0, "s", "own in-flight counts older than the scrapes they explain are stale"
    )
    hold_s: float = knob(60.0, "s", "a pair where others' requests were seen counts as shared this long")
    abort_lag_s: float = knob(
        1.0,
        "s",
        "vLLM aborts a stream it is no longer read at its next step (tens of ms at a saturated batch)",
    )
    grace_durations: float = knob(
        1.0, "request durations", "the others' own flips, and the old engine's drain, take about that"
    )
    backoff_s: tuple[float, float] = knob(
        (10.0, 160.0), "s", "first and longest back-off after a failed try at spec (doubling)"
    )
    backoff_growth: float = knob(
        2.0, "x per failed try", "doubling reaches the longest back-off in four tries"
    )
    lead_hold_durations: float = knob(
        3.0,
        "request durations",
        "a replica that left spec on its own evidence lets the others follow it to plain",
    )
    max_records: int = knob(
        4096, "decisions", "bounds the memory of own counts at thousands of requests a second"
    )


# columns of an own-count record (time, on spec, on base)
_SPEC_COLUMN, _BASE_COLUMN = 1, 2


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
    """This replica's requests against the engines' scraped counts (module doc)."""

    def __init__(self, knobs: SharedKnobs | None = None) -> None:
        self.knobs = knobs or SharedKnobs()
        # per pair (its engines' names): (time, this replica's requests on spec, on base)
        # after each decision
        self._own: dict[tuple[str, str], deque[tuple[float, int, int]]] = {}
        self._shared_until = -math.inf
        self._alone_since = math.inf  # speculating while others run plain, since
        self._held_since = math.inf  # speculating with nobody on plain, since
        self._backoff = self.knobs.backoff_s[0]
        self.blocked_until = -math.inf  # no try at spec before this (after a failed one)

    def view(self, spec: EngineView, base: EngineView, now: float) -> DeviceView:
        own = self._own.get((spec.name, base.name), ())
        lag = self.knobs.abort_lag_s
        fs, fb = _foreign(spec, own, lag), _foreign(base, own, lag)
        if max(fs, fb) >= 1.0:
            self._shared_until = now + self.knobs.hold_s
        return DeviceView(fs, fb, spec.inflight > 0 or fs >= 1.0, base.inflight > 0 or fb >= 1.0)

    def shared(self, now: float) -> bool:
        """Whether others' requests were seen on the pair lately (module doc)."""
        return now < self._shared_until

    def record(self, now: float, spec: EngineView, base: EngineView, route: Route) -> None:
        """This replica's counts once the request is sent."""
        own = self._own.setdefault((spec.name, base.name), deque(maxlen=self.knobs.max_records))
        own.append((now, spec.inflight + (route is Route.SPEC), base.inflight + (route is Route.BASE)))
        while own and own[0][0] < now - self.knobs.own_horizon_s:
            own.popleft()

    def join_spec(
        self, device: DeviceView, *, speculating: bool, last_flip: float, duration_s: float, now: float
    ) -> bool:
        """Whether a replica in fallback follows the others to spec: they run spec and
        nobody else plain (a split costs every request both engines' steps), and its own
        last flip is older than the hold (module doc)."""
        return (
            not speculating
            and device.foreign_spec >= 1.0
            and device.foreign_base < 1.0
            and now - last_flip > self.knobs.lead_hold_durations * duration_s
        )

    def back_to_plain(self, device: DeviceView, *, speculating: bool, duration_s: float, now: float) -> bool:
        """Whether a speculating replica gives up on spec: others have run plain for longer
        than the grace period (module doc)."""
        first, longest = self.knobs.backoff_s
        alone = speculating and device.foreign_base >= 1.0
        if not alone:
            self._alone_since = math.inf
            if speculating:  # spec holds with everyone: a later failed try starts afresh
                self._held_since = min(self._held_since, now)
                if now - self._held_since > longest:
                    self._backoff = first
            else:
                self._held_since = math.inf
            return False
        self._held_since = math.inf
        self._alone_since = min(self._alone_since, now)
        if now - self._alone_since <= self.knobs.grace_durations * duration_s:
            return False
        self._alone_since = math.inf
        self.blocked_until = now + self._backoff
        self._backoff = min(longest, self.knobs.backoff_growth * self._backoff)
        return True


def _foreign(e: EngineView, own: Reversible[tuple[float, int, int]], abort_lag_s: float) -> float:
    """Requests on an engine that are not this replica's, as of its last scrape. This
    replica's own count at the scrape is bounded by the most it had there since the
    decision before the scrape, so its requests that finished since are not read as
    someone else's; nor are those it stopped relaying within ``abort_lag_s`` before the
    scrape (a flip's moved streams, which would otherwise read as another replica's and
    make the pair count as shared after every flip)."""
    st = e.stats
    if e.stale or st.running is None:
        return 0.0
    col = _SPEC_COLUMN if e.route is Route.SPEC else _BASE_COLUMN
    mine = float(e.inflight)
    for rec in reversed(own):
        mine = max(mine, float(rec[col]))
        if rec[0] <= st.at:
            break
    # and those it stopped relaying just before the scrape, which the engine still counted
    mine += sum(1 for t in e.closed_at if st.at - abort_lag_s <= t <= st.at)
    return st.running + (st.waiting or 0.0) - mine
