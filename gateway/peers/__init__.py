"""Gateway replicas joined by a peer channel (optional; off by default).

Replicas in front of the same pairs agree without it, through the engines' own metrics
(:mod:`gateway.routing.adaptive.shared`), but each sees only its share of the traffic, a
second late. With ``peers.url`` set, every replica tells the others, through a real
message broker (Redis pub/sub):

- its requests in flight per engine (every replica then counts the whole cluster's);
- each request it routed by policy, with the load it found, and each outcome it learned
  from (every replica then prices and learns from the whole traffic);
- if it holds the leader's lease, the regime it decided per model (the others follow it,
  and move their streams at its flips as one gateway moves its own).

:mod:`.messages` is the wire format (validated), :mod:`.bus` the transport (in-memory for
tests, :mod:`.redis_bus` for deployments), :mod:`.service` wires them to the models.
"""
