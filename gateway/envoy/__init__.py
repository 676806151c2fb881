"""Envoy's side of the wire, for the Endpoint Picker: what specgate needs to speak to Envoy.

- :mod:`.h2` (the connection), :mod:`.h2stream` (a gRPC stream), :mod:`.h2wire` (frames
  and codes), :mod:`.hpack_cache` (header blocks): a small HTTP/2 server for gRPC, which
  Envoy's ext_proc client and gRPC health checkers connect to;
- :mod:`.messages` on :mod:`.protowire`: the ext_proc messages, read and written;
- :mod:`.health`: ``grpc.health.v1.Health/Check``;
- :mod:`.bootstrap` and :mod:`.cli_envoy_config`: ``specgate envoy-config``, an Envoy
  bootstrap that fronts a config's engines with specgate as its Endpoint Picker.

Nothing here routes: the decisions are :mod:`gateway.api.epp`'s, on the gateway's state.
"""
