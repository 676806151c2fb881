"""CI smoke: a short headless Locust run through the gateway against the emulated pair."""

from __future__ import annotations

import asyncio
import csv
import json
import sys
from pathlib import Path

import pytest

LOCUSTFILE = Path(__file__).resolve().parents[2] / "loadtests" / "locustfile.py"
RUN_S = 15


def _headless(url: str, run_s: float) -> list[str]:
    """The headless Locust command line against ``url`` for ``run_s`` seconds."""
    locust = Path(sys.executable).with_name("locust")
    return [
        str(locust),
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "--only-summary",
        "-H",
        url,
        "-t",
        f"{run_s:g}s",
    ]


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.mark.slow
@pytest.mark.timeout(110)
async def test_headless_locust_run_has_no_failures_and_token_metrics(
    gateway_url: str, tmp_path: Path
) -> None:
    args = [
        *_headless(gateway_url, RUN_S),
        "--qps",
        "3",  # and the default --pool auto
        "--mix",
        "edit=0.5,summary=0.2,chat=0.3",
        "--temperature",
        "choice:0,1",
        "--max-tokens-cap",
        "64",
        "--csv",
        str(tmp_path / "run"),
        "--json-file",
        str(tmp_path / "final"),
        "--specgate-requests-csv",
        str(tmp_path / "requests.csv"),
    ]
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=tmp_path
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), RUN_S + 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    log = out.decode(errors="replace")
    assert proc.returncode == 0, log[-3000:]

    stats = {(r["Type"], r["Name"]): r for r in _rows(tmp_path / "run_stats.csv")}
    agg = stats[("", "Aggregated")]
    assert int(agg["Failure Count"]) == 0, log[-3000:]
    posts = sum(int(r["Request Count"]) for (t, _), r in stats.items() if t == "POST")
    assert 20 <= posts <= 75  # ~3 req/s for 15 s, with the pool left to size itself
    samples = {}
    for metric in ("TTFT", "TPOT", "ITL"):
        samples[metric] = sum(int(r["Request Count"]) for (t, _), r in stats.items() if t == metric)
        assert samples[metric] > 0, f"no {metric} samples"
        assert all(float(r["Median Response Time"]) > 0 for (t, _), r in stats.items() if t == metric)
    assert samples["ITL"] > 5 * samples["TTFT"]  # every gap between tokens, not one per request
    # Aggregated counts the requests, not the TTFT/TPOT/ITL rows beside them
    assert int(agg["Request Count"]) == posts, {k: v["Request Count"] for k, v in stats.items()}
    assert float(agg["Average Content Size"]) == pytest.approx(
        sum(
            float(r["Average Content Size"]) * int(r["Request Count"])
            for (t, _), r in stats.items()
            if t == "POST"
        )
        / posts
    )
    history = _rows(tmp_path / "run_stats_history.csv")
    assert history and int(history[-1]["Total Request Count"]) == posts
    assert _rows(tmp_path / "run_failures.csv") == []

    # The CSVs above are Locust's last periodic snapshot; the JSON, like requests.csv, is
    # written once the users have stopped.
    final = json.loads((tmp_path / "final.json").read_text())
    final_posts = sum(e["num_requests"] for e in final if e["method"] == "POST")
    assert posts <= final_posts <= posts + 3
    reqs = _rows(tmp_path / "requests.csv")
    assert len(reqs) == final_posts
    assert all(r["ok"] == "True" and r["route"] in ("spec", "base") for r in reqs)
    assert {r["kind"] for r in reqs} <= {"edit", "summary", "chat"}
    assert "[specgate]" in log and "0 failed" in log
    assert "late with a pool of" not in log  # the auto pool carried the QPS on time


@pytest.mark.slow
@pytest.mark.timeout(90)
async def test_a_trace_is_replayed_at_its_times(gateway_url: str, tmp_path: Path) -> None:
    """``--trace``: each line's body is sent at its time, labelled with its kind; a bad line
    stops the run before any request, naming the line."""
    trace = tmp_path / "trace.jsonl"
    lines = [
        {"t": 0.2 * i, "kind": "replayed", "body": {"model": "qwen3-8b", "max_tokens": 8,
                                                     "messages": [{"role": "user", "content": f"hi {i}"}]}}
        for i in range(6)
    ]  # fmt: skip
    trace.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    base = _headless(gateway_url, 20)
    args = [*base, "--trace", str(trace), "--specgate-requests-csv", str(tmp_path / "requests.csv")]
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, cwd=tmp_path
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, out.decode(errors="replace")[-3000:]
    reqs = _rows(tmp_path / "requests.csv")
    assert len(reqs) == 6 and {r["kind"] for r in reqs} == {"replayed"}
    assert all(r["ok"] == "True" and int(r["output_tokens"]) > 0 for r in reqs)
    starts = sorted(float(r["start"]) for r in reqs)
    assert starts[-1] - starts[0] >= 0.9  # spread over the trace's 1 s, not sent at once

    trace.write_text('{"t": 0, "body": {}}\n{"body": {}}\n')
    bad = await asyncio.create_subprocess_exec(
        *base, "--trace", str(trace), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(bad.communicate(), 60)
    assert bad.returncode != 0 and "trace.jsonl:2" in out.decode(errors="replace")
