"""Placement across the pairs of one model (docs/fleet.md).

- :mod:`.prices`: what a request costs on a pair, counting what it does to the requests
  already there (marginal time per token, from the pair's own measured step times);
- :mod:`.planner`: how many pairs speculate, from the traffic (a search over the number of
  speculating pairs and the split of the traffic that suits them);
- :mod:`.fleet`: :class:`FleetPolicy`, one :class:`~gateway.routing.adaptive.AdaptivePolicy`
  per pair sharing the model's learning, and each request placed at the lowest cost.
"""

from gateway.placement.fleet import FleetKnobs, FleetPolicy

__all__ = ["FleetKnobs", "FleetPolicy"]
