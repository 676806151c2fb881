"""The adaptive policy, in named parts (read them in this order).

- :mod:`.policy`: :class:`AdaptivePolicy`, the decision per request and the learning from
  each outcome; it wires the parts below.
- :mod:`.pairstate`: the pair's regime between decisions (mode, quiet pair, handover,
  probes, peers, load history), which the policy builds on.
- :mod:`.pricing`: what each regime costs for the traffic now (priors, learned and live
  acceptance, the traffic mix, step times), which the pair state builds on.
- :mod:`.explore`: running an engine whose step time at the load is only assumed.
- :mod:`.stepscale`, :mod:`.context`, :mod:`.mix`, :mod:`.shared`: measured ÷ profile step
  times per engine and load, the traffic's context, the recent traffic, other replicas.
- :mod:`.costmodel`: the two regimes (all on spec, all on plain) priced on one device timeline.
- :mod:`.live`: corrections of that model from the engines' scraped ``/metrics`` windows.
- :mod:`.calibration`: measured ÷ modelled time per token of finished requests, per engine.
- :mod:`.modes`: the regime switch on accumulated evidence, and bounded probing.

The per-class acceptance priors and learner (:mod:`gateway.routing.acceptance`) and the
step-time prior (:mod:`gateway.routing.steptime`) are shared with the rest of routing.
"""

from gateway.routing.adaptive.policy import LOOKUP_DRAFTS_KEY, AdaptivePolicy

__all__ = ["LOOKUP_DRAFTS_KEY", "AdaptivePolicy"]
