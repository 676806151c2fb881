"""The adaptive policy, composed of small parts (read them in this order).

- :mod:`.policy`: :class:`AdaptivePolicy`, the pipeline per request and the wiring.
- :mod:`.estimate`: step 1, both regimes' time per token at the load a request finds
  (priors, learned and live acceptance, the traffic mix, step times, latency bias).
- :mod:`.controller`: step 2, the pair's mode: the evidence switch (:mod:`.modes`), the
  exploration of an engine only assumed (:mod:`.explore`), and the other parts' proposals.
- :mod:`.overrides`: step 3, per-request overrides (quiet pair, handover, exploring,
  probe) and the regime's own route; :mod:`.situation` is what they read.
- :mod:`.cluster`: other gateway replicas, over the peer channel or through the scrapes
  (:mod:`.shared`).
- The estimator's parts: :mod:`.costmodel` (the two regimes on one device timeline),
  :mod:`.mix` (the recent traffic), :mod:`.context` (the context the profile is read
  at), :mod:`.live` and :mod:`.stepscale` (corrections from the scraped ``/metrics``),
  :mod:`.calibration` (measured ÷ modelled time per token), :mod:`.loadlog` (whether a
  measurement is clean), :mod:`.loadbins` (measurements kept per load).
- :mod:`.knobs`: how each part's typed tunables are declared; :mod:`.state`: /admin/state.

The per-class acceptance priors and learner (:mod:`gateway.routing.acceptance`) and the
step-time prior (:mod:`gateway.routing.steptime`) are shared with the rest of routing.
"""

from gateway.routing.adaptive.policy import LOOKUP_DRAFTS_KEY, AdaptivePolicy

__all__ = ["LOOKUP_DRAFTS_KEY", "AdaptivePolicy"]
