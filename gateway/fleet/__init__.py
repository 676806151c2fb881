"""Pairs that join and leave while the gateway serves (docs/discovery.md).

- :mod:`.registry`: each model's live pairs, declared by sources; joins, drains, the
  ``PairsChanged`` event the routing core listens to;
- :mod:`.reload`: a new configuration applied live (SIGHUP, ``POST /admin/reload``, the
  file watch), what cannot be applied reported;
- :mod:`.dns` and :mod:`.k8s`: the discovery sources (a headless Service's DNS records,
  the EndpointSlices of a Service through the Kubernetes API).
"""
