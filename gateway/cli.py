"""`specgate` command line: one dispatcher, one module per subcommand.

Each subcommand lives next to the code it drives and exposes two functions:
``configure(parser)`` adds its flags and ``main(args) -> int`` runs it. Modules are
imported lazily so that ``specgate --help`` stays fast and ``specgate emulate`` does
not pay for the gateway's imports (and vice versa).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Protocol, cast

# name -> (module, one-line help). The module implements the _Subcommand protocol.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("gateway.api.cli_serve", "run the gateway in front of real (or emulated) vLLM engines"),
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
    "config-reference": (
        "gateway.config.cli_reference",
        "write the configuration reference (JSON Schema + Markdown) generated from the config models",
    ),
    "envoy-config": (
        "gateway.envoy.cli_envoy_config",
        "print an Envoy config that fronts this config's engines with specgate as Endpoint Picker",
    ),
}


class _Subcommand(Protocol):
    def configure(self, parser: argparse.ArgumentParser) -> None: ...

    def main(self, args: argparse.Namespace) -> int: ...


def version() -> str:
    """The installed package's version (its metadata), or "unknown" outside an install."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("specgate")
    except PackageNotFoundError:
        return "unknown"


def _load(module: str) -> _Subcommand:
    return cast(_Subcommand, importlib.import_module(module))


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specgate",
        description=(
            "specgate: an OpenAI-compatible gateway for paired vLLM engines (one speculative, one plain) "
            "that sends every request to the engine that will produce it fastest."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run 'specgate <command> --help' for the flags of each command.",
    )
    parser.add_argument("--version", action="version", version=f"specgate {version()}")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    wanted = None
    if argv:
        wanted = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # Only import the module whose flags are needed: keeps `specgate X` start-up lean.
        if wanted == name:
            _load(module).configure(p)
            p.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    return _load(args._module).main(args)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
