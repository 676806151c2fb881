"""What speculation would buy on a team's own traffic, before a second engine runs.

* :mod:`.replay`: one request and its answer → what an n-gram proposer (vLLM's prompt
  lookup, its matching rules) would have drafted and had accepted, per class;
* :mod:`.report`: those replays aggregated per class and temperature bucket, and the
  predicted time per token of a speculative engine against the plain one at each load
  (from the step-time profile), hence the speed-up and the load where it turns into a
  slowdown;
* :mod:`.metrics`: the live advice as Prometheus series (``GET /admin/advice`` serves it).

The offline report from a JSONL log of OpenAI-format requests and answers (``specgate
advise``, and its SVG plot) is a lab tool: ``specgate_lab.advisor``.

Pure (no I/O). Model-based drafters (EAGLE-3, draft models)
cannot be replayed without their weights: the report says so and does not guess them.
"""
