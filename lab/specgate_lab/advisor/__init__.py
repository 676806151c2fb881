"""``specgate advise``: the advisor's offline report on a JSONL log (the live advice is
:mod:`gateway.advisor`, served by the gateway itself)."""
