"""specgate as an Endpoint Picker for Envoy-based inference gateways (ext_proc over gRPC).

The data path: Envoy's HTTP/2 connection (:mod:`.h2`) → one stream per client request
(:mod:`.extproc`) → the proxy's own decision path (:mod:`.pick`) → Envoy relays the bytes
to the engine picked → the response phase (:mod:`.observe`) feeds the policy. Wired into
the gateway app by :mod:`.server` when ``epp.enabled``.
"""
