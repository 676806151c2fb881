"""``loadtests/locust_rate.py`` (``make loadtest``): a short run at a low rate through two
gateway replicas on an emulated pair writes the TTFT, ITL and TPOT distributions with no
failure, both replicas serving; and the distributions merge Locust's per-kind rows by
their histograms."""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.deploy.helpers import load_module

SCRIPT = Path(__file__).resolve().parents[2] / "loadtests" / "locust_rate.py"


@pytest.fixture(scope="module")
def rate() -> ModuleType:
    return load_module(SCRIPT, "specgate_locust_rate")


def test_distributions_merge_the_kinds_rows_by_histogram(rate: ModuleType) -> None:
    entries = [
        {"method": "POST", "name": "chat", "num_requests": 4, "num_failures": 1, "response_times": {"90": 4}},
        {"method": "TTFT", "name": "chat", "response_times": {"10": 2, "20": 1}},
        {"method": "TTFT", "name": "edit", "response_times": {"20": 1, "40": 1}},
        {"method": "ITL", "name": "chat", "response_times": {str(v): 1 for v in range(1, 101)}},
    ]
    s = rate.summarise(entries, duration_s=2.0, target_qps=3.0)
    assert (s["requests"], s["failures"], s["rate_req_s"]) == (4, 1, 2.0)
    ttft = s["distributions_ms"]["TTFT"]
    assert ttft == {"count": 5, "mean": 20.0, "p50": 20.0, "p90": 40.0, "p95": 40.0, "p99": 40.0, "max": 40.0}
    itl = s["distributions_ms"]["ITL"]
    assert (itl["p50"], itl["p90"], itl["p99"], itl["max"]) == (50.0, 90.0, 99.0, 100.0)
    assert s["distributions_ms"]["TPOT"] == {"count": 0}
    assert "| TTFT | 5 | 20.0 | 20.0 | 40.0 |" in rate.markdown(s)


def test_arrival_rate_sums_each_process_over_its_own_span(rate: ModuleType, tmp_path: Path) -> None:
    """Each Locust process's rows are on its own clock: a process's rate is its requests over
    its first-to-last start, and the run's is their sum (start-up before the first request
    and answers cut by -t do not count against it)."""
    for name, starts, late in (
        ("requests.worker0.csv", [10.0, 10.5, 11.0, 11.5, 12.0], 0.0),  # 4 gaps in 2 s
        ("requests.worker1.csv", [100.0, 101.0, 102.0], 0.25),  # 2 gaps in 2 s
    ):
        rows = ["start,lateness"] + [f"{t},{late}" for t in starts]
        (tmp_path / name).write_text("\n".join(rows) + "\n", encoding="utf-8")
    got = rate.arrivals(tmp_path)
    assert got["arrival_rate_req_s"] == pytest.approx(2.0 + 1.0)
    assert got["lateness_p99_ms"] == pytest.approx(250.0)


def test_the_gateway_config_puts_every_pair_under_one_model(rate: ModuleType) -> None:
    cfg = rate.gateway_config(9000, [(9101, 9102), (9201, 9202)])
    (model,) = cfg["models"]
    assert model["name"] == "qwen3-8b"
    assert [p["device"] for p in model["pairs"]] == ["gpu0", "gpu1"]
    assert [p["spec"]["url"] for p in model["pairs"]] == ["http://127.0.0.1:9101", "http://127.0.0.1:9201"]
    assert len({p["base"]["name"] for p in model["pairs"]}) == 2


def test_the_commands_named_in_the_docs_use_its_options(rate: ModuleType) -> None:
    root = SCRIPT.parents[1]
    known = {o for a in rate.parser()._actions for o in a.option_strings}
    text = (root / "loadtests" / "README.md").read_text(encoding="utf-8")
    text += (root / "Makefile").read_text(encoding="utf-8") + (root / "README.md").read_text(encoding="utf-8")
    commands = [
        ln.split("locust_rate.py", 1)[1].split("#", 1)[0]
        for ln in text.splitlines()
        if "locust_rate.py --" in ln
    ]
    assert len(commands) >= 3
    for cmd in commands:
        used = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", cmd))
        assert used and used <= known, (cmd, used - known)


@pytest.mark.slow
@pytest.mark.timeout(110)
async def test_a_short_run_writes_the_distributions_with_no_failure(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(SCRIPT),
        "--qps",
        "4",
        "--duration",
        "8",
        "--pairs",
        "1",
        "--gateways",
        "2",  # Locust's users split over the replicas (-H lists both)
        "--processes",
        "1",
        "--min-rate-share",
        "0.3",  # Poisson arrivals: 8 s at 4 req/s is ~32 requests, whatever the draw
        "--out",
        str(out),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=tmp_path,
    )
    log, _ = await asyncio.wait_for(proc.communicate(), 100)
    assert proc.returncode == 0, log.decode(errors="replace")[-3000:]
    s = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert s["failures"] == 0 and s["requests"] > 0
    assert len(s["requests_by_gateway"]) == 2 and min(s["requests_by_gateway"]) > 0
    assert sum(s["requests_by_gateway"]) == s["requests"]
    d = s["distributions_ms"]
    assert d["TTFT"]["count"] == s["requests"]  # one a request
    assert 0 < d["TPOT"]["count"] <= s["requests"]  # one a request of two tokens or more
    assert d["ITL"]["count"] > s["requests"]  # one per gap between tokens
    for m in ("TTFT", "ITL", "TPOT"):
        # Locust keeps whole milliseconds: on a loaded host a client that reads several
        # events at once sees gaps under 0.5 ms, so a median may read 0; the maxima may not.
        assert 0 <= d[m]["p50"] <= d[m]["p99"] <= d[m]["max"] and d[m]["max"] > 0
    assert s["arrival_rate_req_s"] > 0
    md = (out / "summary.md").read_text(encoding="utf-8")
    assert "| ITL |" in md and (out / "locust_stats.csv").exists()
