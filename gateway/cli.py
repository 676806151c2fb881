"""`specgate` command line: one dispatcher, one module per subcommand.

Each subcommand lives next to the code it drives and exposes two functions:
``configure(parser)`` adds its flags and ``main(args) -> int`` runs it. Modules are
imported lazily so that ``specgate --help`` stays fast and ``specgate emulate`` does
not pay for the gateway's imports (and vice versa).

The runtime's commands are listed here; the lab's (``specgate-lab``: demo, emulate,
simulate, bench, advise) come from its entry points (``COMMAND_GROUP``) when it is
installed, and otherwise a one-line message says how to install it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Protocol, cast

# name -> (module, one-line help). The module implements the _Subcommand protocol.
# The runtime's own commands; the lab's join them from the entry-point group below.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("gateway.api.cli_serve", "run the gateway in front of real (or emulated) vLLM engines"),
    "profile-fit": (
        "gateway.calibrate.cli",
        "fit the routing's step-time profile to an engine pair's own /metrics (a new GPU or model)",
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

# Other distributions add subcommands here: each entry point names a table of the shape
# of SUBCOMMANDS. specgate-lab (the emulator, simulator, bench, demo, advisor's report)
# registers its own; the runtime imports none of it.
COMMAND_GROUP = "specgate.commands"
# The lab's commands by name, only to tell someone who asks for one without the lab
# installed how to get it (tests/api/test_cli_help.py checks it against the lab's table).
LAB_COMMANDS = ("demo", "emulate", "simulate", "bench", "advise")
LAB_HINT = (
    "the lab tools ({}) install apart from the gateway: pip install 'specgate[lab]' "
    "(from a clone of the repository: pip install -e . -e ./lab)".format(", ".join(LAB_COMMANDS))
)


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


def plugin_commands() -> dict[str, tuple[str, str]]:
    """The subcommands other installed distributions register (``COMMAND_GROUP``), by
    name; the runtime's own names win. A broken plugin costs its commands, not the CLI."""
    from importlib.metadata import entry_points

    found: dict[str, tuple[str, str]] = {}
    for ep in sorted(entry_points(group=COMMAND_GROUP), key=lambda e: (e.name, e.value)):
        try:
            table = ep.load()
            items = [(str(n), (str(m), str(h))) for n, (m, h) in dict(table).items()]
        except Exception as exc:  # an outdated or half-installed plugin
            print(f"specgate: ignoring the commands of {ep.value}: {exc!r}", file=sys.stderr)
            continue
        for name, entry in items:
            if name not in SUBCOMMANDS:
                found.setdefault(name, entry)
    return found


def commands_for(wanted: str | None) -> dict[str, tuple[str, str]]:
    """The subcommands to offer: the runtime's, and unless one of those is asked for by
    name (``specgate serve`` does not scan for plugins), the plugins' too."""
    commands = dict(SUBCOMMANDS)
    if wanted not in SUBCOMMANDS:
        commands.update(plugin_commands())
    return commands


def _wanted(argv: Sequence[str] | None) -> str | None:
    return next((a for a in argv or () if not a.startswith("-")), None)


def build_parser(
    argv: Sequence[str] | None = None, commands: dict[str, tuple[str, str]] | None = None
) -> argparse.ArgumentParser:
    wanted = _wanted(argv)
    commands = commands_for(wanted) if commands is None else commands
    epilog = "Run 'specgate <command> --help' for the flags of each command."
    if not any(name in commands for name in LAB_COMMANDS) and wanted not in SUBCOMMANDS:
        epilog += f"\n\nNot installed here: {LAB_HINT}."
    parser = argparse.ArgumentParser(
        prog="specgate",
        description=(
            "specgate: an OpenAI-compatible gateway for paired vLLM engines (one speculative, one plain) "
            "that sends every request to the engine that will produce it fastest."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=epilog,
    )
    parser.add_argument("--version", action="version", version=f"specgate {version()}")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for name, (module, help_text) in commands.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        # Only import the module whose flags are needed: keeps `specgate X` start-up lean.
        if wanted == name:
            _load(module).configure(p)
            p.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    wanted = _wanted(argv)
    commands = commands_for(wanted)
    if wanted in LAB_COMMANDS and wanted not in commands:
        print(f"specgate: '{wanted}' is a lab tool, not installed here: {LAB_HINT}", file=sys.stderr)
        return 2
    parser = build_parser(argv, commands)
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    return _load(args._module).main(args)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
