"""specgate as an Endpoint Picker for Envoy-based inference gateways: the ext_proc surface.

The second surface of the gateway, beside the OpenAI HTTP one: Envoy relays the bytes and
asks, per request, which engine. The data path: Envoy's HTTP/2 connection
(:mod:`gateway.envoy.h2`) → one stream per client request (:mod:`.extproc`) → the OpenAI
surface's own decision path (:mod:`.pick`: admission, keys, model, features, hard rules,
policy) → Envoy relays to the engine picked → the response phase (:mod:`.observe`) feeds
the policy. :mod:`.endpoints` names engines by the address Envoy knows them by;
:mod:`.server` wires the listener into the gateway app when ``epp.enabled``.
"""
