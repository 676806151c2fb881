"""The peer channel's metrics, read at each ``/metrics`` scrape (nothing on the request path)."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.peers.service import PeerService

# Message counters exported, by result (a fixed set: safe as a label).
RESULTS = (
    "sent",
    "received",
    "send_errors",
    "lease_errors",
    "dropped_queue_full",
    "dropped_invalid",
    "dropped_unknown_model",
    "dropped_too_many_peers",
)


class PeerCollector(Collector):
    def __init__(self, service: PeerService) -> None:
        self.service = service

    def describe(self) -> Iterable[Metric]:
        return []  # described by collect() at registration time would touch live state

    def collect(self) -> Iterable[Metric]:
        s = self.service
        leader = GaugeMetricFamily(
            "specgate_peer_leader", "1 while this gateway replica holds the peer channel's leader lease."
        )
        leader.add_metric([], 1.0 if s.leader else 0.0)
        peers = GaugeMetricFamily(
            "specgate_peer_replicas", "Other gateway replicas heard on the peer channel within their expiry."
        )
        peers.add_metric([], float(len(s.peer_names())))
        msgs = CounterMetricFamily(
            "specgate_peer_messages", "Peer channel messages by result.", labels=["result"]
        )
        for r in RESULTS:
            msgs.add_metric([r], float(s.stats.get(r, 0)))
        return [leader, peers, msgs]
