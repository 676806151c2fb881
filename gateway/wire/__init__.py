"""HTTP wire format shared by the gateway's surface and its upstream side.

Header names and header hygiene (:mod:`gateway.wire.headers`) and errors in OpenAI's
shape (:mod:`gateway.wire.errors`). Nothing here knows about engines, routing or the
application: both :mod:`gateway.api` (what the client sees) and :mod:`gateway.proxy`
(what goes to and comes back from an engine) build on it. :mod:`gateway.wire.sse` reads
OpenAI streams as a client does (the load generators and the demo).
"""
