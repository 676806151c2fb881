"""The lab's subcommands of ``specgate``, registered under the entry-point group
``specgate.commands`` (lab/pyproject.toml) and merged into the runtime's dispatcher
(:mod:`gateway.cli`). Same shape as the runtime's table: name -> (module, one-line help);
each module has ``configure(parser)`` and ``main(args) -> int`` and is imported only when
its command runs. Importing this table imports nothing else.
"""

from __future__ import annotations

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "specgate_lab.demo",
        "start an emulated engine pair on one device timeline plus the gateway, and show routing",
    ),
    "emulate": ("specgate_lab.emulator.cli_emulate", "run a GPU-free emulated vLLM OpenAI server"),
    "simulate": (
        "specgate_lab.sim.cli_simulate",
        "socket-free discrete-event run of the routing core against the engine model",
    ),
    "bench": ("specgate_lab.bench.cli_bench", "end-to-end policy benchmark: QPS sweep through real sockets"),
    "advise": (
        "specgate_lab.advisor.cli",
        "offline: what an n-gram speculative engine would accept and gain on a JSONL log of answers",
    ),
}
