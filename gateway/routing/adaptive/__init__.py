"""The adaptive policy, in named parts (read them in this order).

- :mod:`.policy`: :class:`AdaptivePolicy`, the decision per request and the learning from
  each outcome; it wires the parts below.
- :mod:`.costmodel`: the two regimes (all on spec, all on plain) priced on one device timeline.
- :mod:`.live`: corrections of that model from the engines' scraped ``/metrics`` windows.
- :mod:`.calibration`: measured ÷ modelled time per token of finished requests, per engine.
- :mod:`.modes`: the regime switch on accumulated evidence, and bounded probing.

The per-class acceptance priors and learner (:mod:`gateway.routing.acceptance`) and the
step-time prior (:mod:`gateway.routing.steptime`) are shared with the rest of routing.
"""

from gateway.routing.adaptive.policy import LOOKUP_DRAFTS_KEY, AdaptivePolicy

__all__ = ["LOOKUP_DRAFTS_KEY", "AdaptivePolicy"]
