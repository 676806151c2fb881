"""The harness's own record of what each engine did in a slot (preemptions, queue, KV use),
read from the engines' /metrics pages."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.deploy.helpers import load_module

GPU = Path(__file__).resolve().parents[2] / "loadtests" / "gpu"
PAGES = Path(__file__).resolve().parents[1] / "gpu" / "fixtures"


@pytest.fixture(scope="module")
def ew() -> ModuleType:
    return load_module(GPU / "engine_watch.py", "specgate_engine_watch")


def row(t: float, engine: str, **v: float) -> dict[str, object]:
    fields = ("running", "waiting", "kv_usage", "preemptions", "prompt_tokens", "generation_tokens")
    base = dict.fromkeys(fields)
    return {"t": t, "engine": engine, **base, **v}


def test_counters_sum_their_increases_and_restart_from_a_reset(ew: ModuleType) -> None:
    rows = [
        row(0, "base", preemptions=10, prompt_tokens=100, waiting=0, running=3, kv_usage=0.1),
        row(1, "base", preemptions=14, prompt_tokens=900, waiting=7, running=64, kv_usage=0.97),
        row(2, "base", preemptions=2, prompt_tokens=50, waiting=2, running=40, kv_usage=0.5),  # restarted
        row(3, "base", preemptions=5, prompt_tokens=80, waiting=0, running=1, kv_usage=0.02),
        {"t": 4, "engine": "base", "error": "ClientConnectorError()"},
        row(0, "eagle3-lo", preemptions=0, prompt_tokens=0, generation_tokens=0),
        row(1, "eagle3-lo", preemptions=0, prompt_tokens=0, generation_tokens=0),
    ]
    s = ew.summarize(rows)
    assert s["base"]["preemptions"] == 4 + 3
    assert s["base"]["prompt_tokens"] == 800 + 30
    assert s["base"]["generation_tokens"] is None  # never reported
    assert (s["base"]["max_waiting"], s["base"]["max_running"], s["base"]["max_kv_usage"]) == (7, 64, 0.97)
    assert s["base"]["samples"] == 4  # the failed sample is not one
    assert s["eagle3-lo"]["preemptions"] == 0
    md = ew.table_md({"always-base": s})
    assert "| always-base | base | 7 | 7 | 64 | 0.970 | 830 |  |" in md


def test_a_saved_vllm_page_yields_every_field(ew: ModuleType) -> None:
    from gateway.engines.parse import parse_metrics

    text = (PAGES / "final-base.txt").read_text(encoding="utf-8")
    s = parse_metrics(text, "qwen3-8b-base")
    values = {f: getattr(s, f) for f in ew.FIELDS}
    assert all(v is not None for v in values.values()), values


def test_interleaved_windows_carry_the_engines_record(ew: ModuleType) -> None:
    il = load_module(GPU / "interleave.py", "specgate_interleave_ew")
    cols = il.engine_columns(
        {
            "base": {"preemptions": 3.0, "max_waiting": 5.0, "max_kv_usage": 0.9},
            "ngram": {"preemptions": 1.0, "max_waiting": None, "max_kv_usage": 0.4},
        }
    )
    assert cols == {"preemptions": 4.0, "max_waiting": 5.0, "max_kv_usage": 0.9}
    assert il.engine_columns({}) == {"preemptions": None, "max_waiting": None, "max_kv_usage": None}


def test_cpu_is_read_for_a_process_and_its_children(ew: ModuleType) -> None:
    import os
    import subprocess
    import sys

    spin = (
        "import time\nt = time.process_time()\n"
        "while time.process_time() - t < 0.3: pass\nprint(1, flush=True)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", spin + "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    ) as child:
        assert child.stdout is not None and child.stdout.readline() == b"1\n"  # it has spun
        got = ew.cpu(os.getpid())
        assert got["cpu_top_s"] > 0
        assert got["cpu_sub_s"] >= 0.3 - 2.0 / os.sysconf("SC_CLK_TCK")  # the child's, to a tick
        child.kill()
    assert ew.cpu(child.pid) == {}  # gone


def test_cpu_cores_over_the_slot_and_in_its_busiest_second(ew: ModuleType) -> None:
    rows = [
        {"t": 0.0, "engine": "gateway", "cpu_top_s": 10.0, "cpu_sub_s": 0.0},
        {"t": 1.0, "engine": "gateway", "cpu_top_s": 10.5, "cpu_sub_s": 0.0},
        {"t": 2.0, "engine": "gateway", "cpu_top_s": 11.5, "cpu_sub_s": 0.0},
        {"t": 4.0, "engine": "gateway", "cpu_top_s": 11.5, "cpu_sub_s": 0.0},
    ]
    s = ew.summarize(rows)["gateway"]
    assert s["cpu_top_mean"] == pytest.approx(1.5 / 4.0)
    assert s["cpu_top_max"] == pytest.approx(1.0)
    assert s["cpu_sub_max"] == 0.0
    assert s["preemptions"] is None
