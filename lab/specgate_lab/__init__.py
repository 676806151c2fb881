"""specgate's lab: the tools around the gateway, installed apart from it (``specgate-lab``).

* :mod:`.emulator`: a GPU-free vLLM OpenAI server with speculative decoding (``specgate emulate``);
* :mod:`.workload`: the prompt corpus and target-QPS schedules (``python -m specgate_lab.workload``);
* :mod:`.sim`: socket-free discrete-event runs of the routing core (``specgate simulate``);
* :mod:`.bench`: policy sweeps and scenarios through real sockets (``specgate bench``);
* :mod:`.advisor`: the advisor's offline report on a JSONL log (``specgate advise``);
* :mod:`.demo`: the emulated pair and the gateway in one process (``specgate demo``), and
  :mod:`.promlab`, the same with a real Prometheus (the end-to-end telemetry test, the
  dashboard renderer).

The lab imports :mod:`gateway` (the runtime) freely; the runtime never imports the lab. Its
subcommands reach ``specgate`` through the entry-point group ``specgate.commands``
(:mod:`.commands`).
"""
