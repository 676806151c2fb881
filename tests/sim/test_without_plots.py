"""``specgate simulate`` and ``specgate bench`` on a lab install without its plots extra (no matplotlib):
the results are written, the plot is skipped with a message naming the extra, the exit
status is 0."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import pytest

from specgate_lab.bench import cli_bench
from specgate_lab.bench.report import write_all
from tests.bench.test_bench_parts import _rows

# Run as a user would, with matplotlib unimportable (as after `pip install specgate-lab`).
_NO_MATPLOTLIB = (
    "import sys; sys.modules['matplotlib'] = None; from gateway.cli import main; sys.exit(main())"
)


async def test_simulate_writes_its_results_without_matplotlib(tmp_path: Path) -> None:
    argv = ["simulate", "--qps", "2", "--duration", "20", "--policies", "always-base", "--out", str(tmp_path)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _NO_MATPLOTLIB,
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    assert b"ModuleNotFoundError" not in err and b"pip install 'specgate-lab[plots]'" in err
    assert b"results.{csv,json,md}" in out
    assert json.loads((tmp_path / "results.json").read_text())
    assert (tmp_path / "results.md").exists() and not (tmp_path / "results.png").exists()


def test_bench_publishes_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # type: ignore[arg-type]
    paths = write_all(str(tmp_path / "run"), {"title": "t"}, _rows())
    assert "png" not in paths and Path(paths["json"]).exists() and Path(paths["md"]).exists()
    readme = tmp_path / "README.md"
    readme.write_text(f"{cli_bench.README_BEGIN}\n{cli_bench.README_END}\n")
    p = argparse.ArgumentParser()
    cli_bench.configure(p)
    args = p.parse_args(
        ["--from-json", paths["json"], "--out", str(tmp_path / "again"), "--update-readme", str(readme)]
    )
    assert cli_bench.main(args) == 0
    err = capsys.readouterr().err
    assert "pip install 'specgate-lab[plots]'" in err and "not updated" in err
    assert (tmp_path / "again" / "results.json").exists()
