"""The benchmark's parts without subprocesses: load generator, report, README update."""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from specgate_lab.bench import cli_bench, scenario_bench
from specgate_lab.bench.loadgen import run_point
from specgate_lab.bench.report import markdown_table, write_all

SEEN = web.AppKey("seen", list[dict[str, object]])


def _fake_engine(tokens: int = 5, fail_every: int = 0, hang: asyncio.Event | None = None) -> web.Application:
    seen: list[dict[str, object]] = []

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append(body)
        if fail_every and len(seen) % fail_every == 0:
            return web.json_response({"error": {"message": "boom", "type": "x", "code": 500}}, status=500)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream", "x-specgate-route": "spec"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n')
        if hang is not None:
            await hang.wait()
        for _ in range(tokens):
            await resp.write(b'data: {"choices":[{"delta":{"content":" w"}}]}\n\n')
        usage = {"choices": [], "usage": {"completion_tokens": tokens}}
        await resp.write(f"data: {json.dumps(usage)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app[SEEN] = seen
    return app


async def test_run_point_records_streams(tmp_path: Path) -> None:
    app = _fake_engine(tokens=5, fail_every=4)
    async with TestServer(app) as server:
        res = await run_point(
            str(server.make_url("")), "m", 200.0, duration_s=0.2, warmup_s=0.05, seed=3, max_tokens_cap=32
        )
    seen = app[SEEN]
    assert seen and all(b["stream"] is True and b["model"] == "m" for b in seen)
    assert res.records and res.unfinished == 0
    ok = [r for r in res.records if r.ok]
    bad = [r for r in res.records if not r.ok]
    assert ok and bad and all("HTTP 500" in r.error for r in bad)
    assert all(r.output_tokens == 5 and r.chunks == 5 and r.route == "spec" for r in ok)
    assert all(r.ttft is not None and r.e2e is not None and r.ttft <= r.e2e for r in ok)
    assert res.tokens_in_window > 0
    by_kind = cli_bench._tpot_by_kind(res)
    assert (
        by_kind
        and set(by_kind) <= {"edit", "summary", "rag", "chat"}
        and all(v >= 0 for v in by_kind.values())
    )
    out = tmp_path / "requests.csv"
    cli_bench._write_requests(str(out), res)
    assert len(out.read_text().splitlines()) == len(res.records) + 1


async def test_run_point_counts_unfinished_after_drain() -> None:
    hang = asyncio.Event()
    async with TestServer(_fake_engine(hang=hang)) as server:
        res = await run_point(str(server.make_url("")), "m", 100.0, duration_s=0.1, drain_s=0.2, seed=1)
        hang.set()
    assert res.unfinished > 0 and res.records == []


@pytest.mark.parametrize(
    "argv",
    [["--policies", "bogus"], ["--qps", "0"], ["--qps", "x"], ["--time-scale", "-1"], ["--mix", "nope=1"]],
)
def test_bad_arguments_are_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    p = argparse.ArgumentParser()
    cli_bench.configure(p)
    assert cli_bench.main(p.parse_args(argv)) == 2
    assert "error:" in capsys.readouterr().err


def test_auto_time_scale() -> None:
    assert cli_bench._auto_scale(1, 200, 1500) == 1.0
    assert cli_bench._auto_scale(48, 250, 1500) == 8.0


def _rows() -> list[dict[str, object]]:
    return [
        {
            "policy": p,
            "qps": q,
            "tpot_mean_ms": 5.0 + q,
            "tpot_p99_ms": 9.0 + q,
            "throughput_tps": 100.0 * q,
            "spec_share": 0.5,
            "requests": 10,
            "failures": 0,
            "unfinished": 0,
        }
        for p in ("adaptive", "always-base")
        for q in (1.0, 4.0)
    ]


def test_report_files(tmp_path: Path) -> None:
    paths = write_all(str(tmp_path), {"title": "t"}, _rows())
    assert Path(paths["png"]).stat().st_size > 1000
    assert json.loads(Path(paths["json"]).read_text())["results"][0]["policy"] == "adaptive"
    assert len(Path(paths["csv"]).read_text().splitlines()) == 5
    md = markdown_table(_rows())
    assert md.count("\n") == 5 and "| adaptive | 1 |" in md and "50%" in md and "–" in md


def test_update_readme(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{cli_bench.README_BEGIN}\nold\n{cli_bench.README_END}\ntail\n")
    assert cli_bench.update_readme(str(readme), "new table")
    assert readme.read_text() == f"# x\n{cli_bench.README_BEGIN}\nnew table\n{cli_bench.README_END}\ntail\n"
    other = tmp_path / "OTHER.md"
    other.write_text("no markers\n")
    assert not cli_bench.update_readme(str(other), "x") and other.read_text() == "no markers\n"


def test_from_json_republishes_without_running(tmp_path: Path) -> None:
    meta = {
        "command": "specgate bench",
        "date": "d",
        "mix_desc": "mix",
        "temperature": "0",
        "duration_s": 8,
        "min_requests": 24,
        "warmup_s": 3,
        "tpot_slo_ms": 30,
        "ttft_slo_ms": 3000,
        "title": "t",
    }
    src = tmp_path / "old"
    write_all(str(src), meta, _rows())
    readme = tmp_path / "README.md"
    readme.write_text(f"{cli_bench.README_BEGIN}\n{cli_bench.README_END}\n")
    p = argparse.ArgumentParser()
    cli_bench.configure(p)
    out = tmp_path / "new"
    args = p.parse_args(
        ["--from-json", str(src / "results.json"), "--out", str(out), "--update-readme", str(readme)]
    )
    assert cli_bench.main(args) == 0
    text = readme.read_text()
    assert "| adaptive | 4 |" in text and "new/tpot_throughput_vs_qps.png" in text
    assert (out / "results.csv").exists()
    bad = p.parse_args(["--from-json", str(tmp_path / "missing.json")])
    assert cli_bench.main(bad) == 2


async def test_scenario_requests_go_out_at_their_times_with_their_seeds() -> None:
    """The scenario bench sends the simulator's very requests (seeded, at their arrival times)
    and records them on the scenario clock."""
    from specgate_lab.sim.scenarios import Phase, scenario_requests

    work = scenario_requests(
        (Phase(0.3, 40.0, 40.0, "edit=1", "0.5"),), seed=2, mix=None, temperature="0", max_tokens_cap=16
    )
    assert len(work) >= 3
    app = _fake_engine(tokens=6)
    async with TestServer(app) as server:
        recs = await scenario_bench.send_all(str(server.make_url("/v1/chat/completions")), work, 1.0, 5.0)
    assert [r.arrival for r in recs] == [t for t, _ in work]
    assert all(r.route == "spec" and r.output_tokens == 6 and r.finished_at is not None for r in recs)
    assert all(r.tpot_s is not None and r.ttft_s is not None and r.finished_at > r.arrival for r in recs)
    assert [b["seed"] for b in app[SEEN]] == [wr.seed for _, wr in work]
    assert all(b["temperature"] == 0.5 for b in app[SEEN])


def test_requests_csv_holds_both_sides_request_by_request(tmp_path: Path) -> None:
    from specgate_lab.sim.records import RequestRecord as SimRecord

    bench = {"adaptive": [scenario_bench.SocketRecord(1.5, "spec", "join_running", 40, 0.02, 0.0051, 1.8)]}
    sim = {
        "adaptive": [
            SimRecord(1.5, "edit", "edit", "edit", 0.0, "base", "hysteresis", False, 40, None, None, None)
        ]
    }
    scenario_bench.write_requests(tmp_path / "requests.csv", bench, sim)
    rows = list(csv.DictReader((tmp_path / "requests.csv").read_text(encoding="utf-8").splitlines()))
    assert [(r["side"], r["route"], r["reason"]) for r in rows] == [
        ("bench", "spec", "join_running"),
        ("sim", "base", "hysteresis"),
    ]
    assert (rows[0]["tpot_ms"], rows[0]["ttft_ms"]) == ("5.100", "20.000")
    assert rows[1]["tpot_ms"] == ""  # unfinished: no time, not zero


def test_scenario_comparison_is_bench_over_simulator() -> None:
    def report(tpot: float, vs: float) -> dict[str, object]:
        rows = [
            {"policy": p, "mean_tpot_ms": tpot * f, "p99_tpot_ms": 2 * tpot * f, "mean_ttft_ms": 10.0}
            for p, f in (("adaptive", 1.0), ("always-spec", 1.1), ("oracle", 0.9))
        ]
        return {"rows": rows, "adaptive": {"vs_best_static": vs, "vs_oracle": vs + 0.1}}

    cmp = scenario_bench.compare(report(5.25, 0.95), report(5.0, 0.97), ["adaptive", "always-spec"])
    assert cmp["adaptive"]["mean_tpot_ms"] == pytest.approx(1.05)
    assert cmp["always-spec"]["p99_tpot_ms"] == pytest.approx(1.05)
    assert cmp["oracle"]["mean_ttft_ms"] == pytest.approx(1.0)
    assert cmp["adaptive ÷ best static"] == {"bench": 0.95, "sim": 0.97}
    assert "adaptive | 1.050 | 1.050 | 1.000" in scenario_bench._comparison_md(cmp)


@pytest.mark.parametrize(
    "argv",
    [
        ["--scenario", "nope"],
        ["--scenario", "mix-shift", "--time-scale", "2"],
        ["--scenario", "mix-shift", "--policies", "temperature"],
        ["--scenario", "mix-shift", "--scenario-scale", "0"],
        ["--scenario", "mix-shift", "--replicas", "9"],
        ["--replicas", "2"],  # replicas are a scenario run's
        ["--scenario", "eagle3-round16"],  # a scenario with its own engine pair: the simulator's
    ],
)
def test_bad_scenario_arguments_are_refused(
    argv: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    p = argparse.ArgumentParser()
    cli_bench.configure(p)
    assert cli_bench.main(p.parse_args([*argv, "--out", str(tmp_path)])) == 2
    assert "error:" in capsys.readouterr().err


async def test_scenario_requests_go_to_the_replicas_in_turn_while_their_modes_are_sampled() -> None:
    """Client-side round robin over gateway replicas, and the samples that show a split:
    each replica's mode from GET /admin/state, each engine's running count from /metrics."""
    from specgate_lab.bench.procs import Stack
    from specgate_lab.sim.agreement import Sample
    from specgate_lab.sim.scenarios import Phase, scenario_requests

    work = scenario_requests(
        (Phase(0.6, 20.0, 20.0, "edit=1", "0"),), seed=3, mix=None, temperature="0", max_tokens_cap=8
    )
    assert len(work) >= 4
    apps = [_fake_engine(tokens=3), _fake_engine(tokens=3)]
    for app, mode in zip(apps, ("speculating", "fallback"), strict=True):
        state = {"models": {scenario_bench.MODEL: {"policy_state": {"mode": mode}}}}

        async def admin(_: web.Request, state: dict[str, object] = state) -> web.Response:
            return web.json_response(state)

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(text='vllm:num_requests_running{model_name="m"} 2.0\n')

        app.router.add_get("/admin/state", admin)
        app.router.add_get("/metrics", metrics)
    async with TestServer(apps[0]) as a, TestServer(apps[1]) as b:
        bases = [str(s.make_url("")).rstrip("/") for s in (a, b)]
        samples: list[Sample] = []
        stack = Stack(gateways=bases, engines=bases)
        urls = [u + "/v1/chat/completions" for u in bases]
        recs = await scenario_bench.send_all(urls, work, 1.0, 5.0, stack, samples)
    assert all(r.finished_at is not None for r in recs)
    seeds = [wr.seed for _, wr in work]
    assert [x["seed"] for x in apps[0][SEEN]] == seeds[0::2]
    assert [x["seed"] for x in apps[1][SEEN]] == seeds[1::2]
    assert samples and all(
        s.modes == ("speculating", "fallback") and s.running == (2.0, 2.0) for s in samples
    )


def test_replica_agreement_counts_split_samples() -> None:
    from specgate_lab.bench.replicas import mode_of, running_of
    from specgate_lab.sim.agreement import Sample, agreement

    xs = [
        Sample(0.5, ("speculating", "fallback"), (1.0, 1.0)),  # before t0: not counted
        Sample(1.0, ("fallback", "fallback"), (0.0, 3.0)),
        Sample(1.5, ("speculating", "fallback"), (2.0, 1.0)),
        Sample(2.0, ("fallback", "fallback"), (0.0, 0.0)),
        Sample(2.5, ("fallback", None), (0.0, 1.0)),  # an unreadable state counts as differing
    ]
    assert agreement(xs, t0=1.0) == {"modes_differ": 0.5, "both_engines_busy": 0.25}
    assert agreement([], t0=0.0) == {"modes_differ": 0.0, "both_engines_busy": 0.0}
    assert mode_of({"models": {"m": {"policy_state": {"mode": "fallback"}}}}, "m") == "fallback"
    assert mode_of({"models": {}}, "m") is None and mode_of([], "m") is None
    assert running_of('# HELP x\nvllm:num_requests_running{engine="0"} 7.0\n') == 7.0
    assert running_of("vllm:num_requests_waiting 3\n") == 0.0


def test_switch_spread_pairs_each_replicas_kth_switch() -> None:
    from specgate_lab.sim.agreement import Sample, switch_spread

    s, f = "speculating", "fallback"
    modes = [(s, s), (f, s), (f, s), (f, f), (f, f), (s, f), (s, s)]  # 1.0 s, then 2.0 s apart
    xs = [Sample(float(i), m, (0.0, 0.0)) for i, m in enumerate(modes)]
    assert switch_spread(xs) == 2.0  # first change: 1 vs 3 (2 s); second: 5 vs 6 (1 s)
    assert switch_spread(xs[:2]) is None  # one replica switched, the other did not
    assert switch_spread([Sample(0.0, (s, s), ()), Sample(1.0, (s, s), ())]) == 0.0
