"""Per-pair series of the routing state: each pair's regime and load, the fleet's plan.

Read at scrape time like the rest of :mod:`.state`, from the model's routing view (the
pairs that take new requests) and the policy's snapshot, so a pair's series exist exactly
while it is in the view: a pair that leaves (drains, then is gone) stops being exported
at the next scrape, and the number of ``pair`` values is the fleet's size, whatever
discovery adds and removes over time. A pair is named by its plain engine
(``gateway.placement.fleet.pair_key``), the key the fleet's snapshot uses.

Snapshot keys read (all optional):

- ``fleet``: ``{"pairs": {pair: {"speculating": bool}}, "speculating": n, "planned": n}``
  (:class:`~gateway.placement.FleetPolicy` with more than one pair);
- without it, on a model of one pair, ``mode`` (``speculating`` or not) is that pair's regime
  (and its plan: a lone pair's policy decides its regime itself).
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client.core import GaugeMetricFamily, Metric

from gateway.routing.types import ModelView, PairView
from gateway.telemetry.labels import clean


class PairFamilies:
    """The per-pair and per-fleet gauge families of one scrape."""

    def __init__(self) -> None:
        g = GaugeMetricFamily
        self.speculating = g(
            "specgate_pair_speculating",
            "Regime of each pair: 1 when it speculates (new requests go to its speculative engine), "
            "0 when it runs plain.",
            labels=["model", "pair"],
        )
        self.load = g(
            "specgate_pair_load_requests",
            "Requests on each pair as placement counts them: per engine, the gateway's in-flight count "
            "or the scraped running + waiting if higher, summed over the pair's engines.",
            labels=["model", "pair"],
        )
        self.running = g(
            "specgate_pair_engine_running_requests",
            "Requests each engine of each pair reports running (its last scrape).",
            labels=["model", "pair", "route"],
        )
        self.waiting = g(
            "specgate_pair_engine_waiting_requests",
            "Requests each engine of each pair reports waiting (its last scrape).",
            labels=["model", "pair", "route"],
        )
        self.inflight = g(
            "specgate_pair_engine_inflight_requests",
            "Requests this gateway has in flight on each engine of each pair.",
            labels=["model", "pair", "route"],
        )
        self.pairs = g(
            "specgate_fleet_pairs",
            "Pairs of the model that take new requests (draining pairs excluded).",
            labels=["model"],
        )
        self.spec_pairs = g(
            "specgate_fleet_speculating_pairs",
            "Pairs of the model that speculate now.",
            labels=["model"],
        )
        self.planned = g(
            "specgate_fleet_planned_speculating_pairs",
            "The placement planner's count of pairs that should speculate for the recent traffic "
            "(pairs follow it, each after its minimum dwell in a regime).",
            labels=["model"],
        )

    def all(self) -> list[Metric]:
        return [
            self.speculating,
            self.load,
            self.running,
            self.waiting,
            self.inflight,
            self.pairs,
            self.spec_pairs,
            self.planned,
        ]

    def add(self, m: str, view: ModelView, snapshot: Mapping[str, object]) -> None:
        """The series of model ``m`` (label-cleaned) from its view and policy snapshot."""
        regime_of = regimes(view, snapshot)
        spec = 0
        for pair in view.pairs:
            p = clean(pair.base.name)
            regime = regime_of.get(pair.base.name)
            if regime is not None:
                self.speculating.add_metric([m, p], 1.0 if regime else 0.0)
                spec += regime
            self.load.add_metric([m, p], sum(e.load for e in pair.engines))
            for e in pair.engines:
                labels = [m, p, e.route.value]
                self.inflight.add_metric(labels, float(e.inflight))
                if e.stats.running is not None:
                    self.running.add_metric(labels, e.stats.running)
                if e.stats.waiting is not None:
                    self.waiting.add_metric(labels, e.stats.waiting)
        self.pairs.add_metric([m], float(len(view.pairs)))
        if regime_of:
            self.spec_pairs.add_metric([m], float(spec))
        fleet = snapshot.get("fleet")
        planned = fleet.get("planned") if isinstance(fleet, Mapping) else None
        if isinstance(planned, int) and not isinstance(planned, bool):
            self.planned.add_metric([m], float(planned))
        elif not isinstance(fleet, Mapping) and len(view.pairs) == 1 and regime_of:
            self.planned.add_metric([m], float(spec))  # one pair plans its own regime


def regimes(view: ModelView, snapshot: Mapping[str, object]) -> dict[str, bool]:
    """Each pair's regime by pair key: the fleet's, else the model's mode on one pair."""
    out: dict[str, bool] = {}
    fleet = snapshot.get("fleet")
    pairs = fleet.get("pairs") if isinstance(fleet, Mapping) else None
    if isinstance(pairs, Mapping):
        for pair in view.pairs:
            info = pairs.get(pair.base.name)
            if isinstance(info, Mapping) and isinstance(info.get("speculating"), bool):
                out[pair.base.name] = _effective(pair, info["speculating"])
        return out
    mode = snapshot.get("mode")
    if len(view.pairs) == 1 and isinstance(mode, str):
        pair = view.pairs[0]
        out[pair.base.name] = _effective(pair, mode == "speculating")
    return out


def _effective(pair: PairView, speculating: bool) -> bool:
    """A pair without a usable speculative engine runs plain whatever its policy's regime."""
    if pair.spec is None or not pair.spec.usable:
        return False
    return speculating or not pair.base.usable
