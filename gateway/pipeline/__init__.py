"""One request pipeline for the gateway and the simulator.

:func:`~gateway.pipeline.request.parse_request` turns an OpenAI request body into the
:class:`~gateway.routing.types.RequestFeatures` the policy decides on;
:func:`~gateway.pipeline.outcome.build_outcome` turns a finished answer into the
:class:`~gateway.routing.types.Outcome` it learns from. Both are pure (no I/O, no aiohttp):
the gateway's handlers and ``specgate simulate`` call the same two functions, so simulated
routing sees what the gateway would.
"""
