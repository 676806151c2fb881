"""Envoy's side of the wire, for the Endpoint Picker: what specgate needs to speak to Envoy.

- :mod:`.h2` + :mod:`.hpack_cache`: a small HTTP/2 server for gRPC (Envoy's ext_proc client
  and gRPC health checkers connect to it);
- :mod:`.messages`: the ext_proc messages, read and written (Envoy's protobufs);
- :mod:`.health`: ``grpc.health.v1.Health/Check``;
- :mod:`.bootstrap`: ``specgate envoy-config``, an Envoy bootstrap that fronts a config's
  engines with specgate as its Endpoint Picker.

Nothing here routes: the decisions are :mod:`gateway.api.epp`'s, on the gateway's state.
"""
