"""What moving a reasoning stream only after its think block costs, on the simulator.

A flip moves the old engine's answering streams to the new engine (``routing.move_on_flip``).
A stream still thinking cannot be continued through the chat template (docs/moves.md), so
the gateway moves it once its content begins: the rest of its reasoning runs on the old
engine. This runs one scenario of ``specgate simulate`` (its own flags, the adaptive policy,
moves on), records every answering stream a flip moved (its tokens so far, and its final
length once the run is over), and reports the share of the moved tokens that would stay on
the old engine if each answer's first ``f`` were reasoning, for several ``f``:

    python loadtests/move_share.py --scenario temp-shift --time-scale 0.25

Compare with what moving buys at all: the same scenario with ``--routing
'{"move_on_flip": false}'`` (``specgate simulate`` prints both tables).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specgate_lab.emulator.device import Device
from specgate_lab.sim import cli_simulate

SHARES = (0.25, 0.5, 0.75, 0.9)  # reasoning's share of an answer's tokens


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    cli_simulate.configure(parser)
    out = tempfile.mkdtemp(prefix="move-share-")  # the simulator's report files: not read here
    args = parser.parse_args(["--policies", "adaptive", "--out", out, *argv])
    moved: list[tuple[int, Any]] = []  # (tokens when moved, the request: its final output later)
    real = Device.migrate

    def spy(self: Device, src: Any, dst: Any, req: Any, now: float) -> Any:
        if req.output:
            moved.append((len(req.output), req))
        return real(self, src, dst, req, now)

    Device.migrate = spy  # type: ignore[method-assign]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            rc = cli_simulate.main(args)
    finally:
        Device.migrate = real  # type: ignore[method-assign]
    if rc:
        return rc
    total = sum(len(r.output) - done for done, r in moved)
    print(f"{len(moved)} answering streams moved, {total} tokens generated on the new engine")
    for f in SHARES:
        kept = sum(max(0, min(len(r.output), round(f * len(r.output))) - done) for done, r in moved)
        thinking = sum(done < f * len(r.output) for done, r in moved)
        share = kept / total if total else 0.0
        print(
            f"reasoning {f:.0%} of each answer: {thinking} moved mid-reasoning;",
            f"{share:.0%} of the moved tokens stay",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
