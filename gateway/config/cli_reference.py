"""``specgate config-reference``: write the configuration reference (JSON Schema and
Markdown table) generated from the config models, or check that the written ones are current."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gateway.config.reference import COMMAND, files


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        metavar="DIR",
        default="docs",
        help="folder to write config.schema.json and config-reference.md (default: docs)",
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when the files in --out are not current"
    )


def stale(out: Path) -> list[str]:
    """The generated files of ``out`` that are missing or differ from what is generated now."""
    return [
        name
        for name, text in files().items()
        if not (out / name).is_file() or (out / name).read_text(encoding="utf-8") != text
    ]


def main(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.check:
        old = stale(out)
        if old:
            print(f"specgate: {', '.join(old)} in {out} not current: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files().items():
        (out / name).write_text(text, encoding="utf-8")
        print(out / name)
    return 0
