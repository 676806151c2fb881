"""Per-request overrides: step 3 of the policy's pipeline (:mod:`..policy`).

Each is a small part with one method, ``route(situation) -> Pick | None``, asked in this
order; the first that returns a route decides, and the regime's own route
(:mod:`.regime`) answers when none does:

1. :mod:`.quiet`: on a quiet pair a request picks its engine itself;
2. :mod:`.handover`: after a flip, the old engine takes new requests until it idles;
3. :mod:`.exploring`: the engine being explored;
4. :mod:`.probe`: in fallback, a bounded share of short requests measures spec.

The hard rules (:func:`gateway.routing.rules.apply_hard_rules`: refused parameters, dead
engines, pins, a client's forced route) come before the whole pipeline, shared by every
policy.
"""
