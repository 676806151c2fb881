"""Drive a target request rate through the gateway on emulated engines with Locust, and
write the TTFT, ITL and TPOT distributions and the failure count.

    python loadtests/locust_rate.py --qps 200 --duration 60 --out out/loadtest   # = make loadtest

It starts ``--pairs`` emulated engine pairs (one ``specgate emulate --pair`` process each,
each pair on its own emulated H200, so that the emulator's CPU spreads over cores and its
engines are not what limits the rate), ``--gateways`` gateway replicas (``specgate serve``,
each alone: no peer channel) with one model on all of those pairs, then Locust headless
(``loadtests/locustfile.py``, ``--processes`` worker processes, its users split over the
replicas) at ``--qps`` Poisson arrivals of short streamed chat answers
(``--max-tokens-cap``). Outputs in ``--out``: ``summary.json`` and ``summary.md`` (the
rate reached, failures, and per distribution count, mean, p50, p90, p95, p99, max in
ms), Locust's CSVs (``locust_stats.csv``, ...), ``locust.json``, one row per request
(``requests*.csv``) and the processes' logs. Exit status 0 when no request failed and the
rate reached at least ``--min-rate-share`` of the target.

The rate one host can drive depends on its cores: the emulator, the gateway and Locust
share them. ``--pairs auto`` and ``--processes auto`` take a quarter of the cores each
(at least one, at most four), ``--gateways auto`` one replica per 8 cores: one gateway
process took about 9 ms of CPU per streamed 32-token answer here (one event loop, one
core: ~110 req/s). See loadtests/README.md for the rates measured.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specgate_lab.bench.procs import Proc, child_pids, emulated_pair_model, free_port, process_cpu_s  # noqa: E402

LOCUSTFILE = ROOT / "loadtests" / "locustfile.py"
METRICS = ("TTFT", "ITL", "TPOT")
PERCENTILES = (0.5, 0.9, 0.95, 0.99)


def _auto(value: str, cores: int, per: int = 4) -> int:
    """``auto``: one per ``per`` cores, at least one, at most four; else the number given."""
    return max(1, min(4, cores // per)) if value == "auto" else max(1, int(value))


def gateway_config(port: int, pairs: list[tuple[int, int]]) -> dict[str, Any]:
    """One model, ``qwen3-8b``, on every emulated pair (pair i on device gpu<i>)."""
    model = emulated_pair_model(
        f"http://127.0.0.1:{pairs[0][0]}",
        f"http://127.0.0.1:{pairs[0][1]}",
        name="qwen3-8b",
        device="gpu0",
        spec_extra={"prompt_lookup_min": 2, "prompt_lookup_max": 5},
        timeouts={"connect_s": 5.0, "first_byte_s": 60.0, "idle_s": 60.0, "total_s": 300.0},
    )
    first = model["pairs"][0]
    model["pairs"] = []
    for i, (sp, bp) in enumerate(pairs):
        spec = {**first["spec"], "name": f"spec{i}", "url": f"http://127.0.0.1:{sp}"}
        base = {**first["base"], "name": f"base{i}", "url": f"http://127.0.0.1:{bp}"}
        model["pairs"].append({"device": f"gpu{i}", "spec": spec, "base": base})
    return {
        "server": {"host": "127.0.0.1", "port": port, "max_concurrency": 8192},
        "scrape": {"enabled": True, "interval_s": 0.5, "timeout_s": 1.0, "stale_after_s": 5.0},
        "models": [model],
    }


def percentiles(hist: Mapping[float, int]) -> dict[str, float]:
    """Count, mean, percentiles and max of a histogram {value: count}."""
    n = sum(hist.values())
    if n == 0:
        return {"count": 0}
    items = sorted(hist.items())
    out: dict[str, float] = {"count": n, "mean": sum(v * c for v, c in items) / n}
    for p in PERCENTILES:
        rank, seen = p * n, 0
        for v, c in items:
            seen += c
            if seen >= rank:
                out[f"p{round(p * 100)}"] = v
                break
    out["max"] = items[-1][0]
    return out


def distributions(entries: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """TTFT, ITL and TPOT (ms) from Locust's final JSON stats: each metric's rows (one per
    request kind) merged by their response-time histograms."""
    merged: dict[str, dict[float, int]] = {m: {} for m in METRICS}
    for e in entries:
        hist = merged.get(str(e.get("method")))
        if hist is None:
            continue
        for value, count in (e.get("response_times") or {}).items():
            hist[float(value)] = hist.get(float(value), 0) + int(count)
    return {m: percentiles(h) for m, h in merged.items()}


def summarise(entries: list[Mapping[str, Any]], duration_s: float, target_qps: float) -> dict[str, Any]:
    posts = [e for e in entries if e.get("method") == "POST"]
    requests = sum(int(e.get("num_requests", 0)) for e in posts)
    failures = sum(int(e.get("num_failures", 0)) for e in posts)
    return {
        "target_qps": target_qps,
        "duration_s": duration_s,
        "requests": requests,
        "failures": failures,
        "rate_req_s": requests / duration_s if duration_s > 0 else 0.0,
        "distributions_ms": distributions(entries),
    }


def arrivals(out: Path) -> dict[str, float]:
    """The rate requests left at while the load ran, from the per-request CSVs (one per
    Locust process, each on its own clock): each file's requests over the span between its
    first and last start, summed. Unlike requests ÷ ``-t``, it leaves out the processes'
    start-up and the answers still in flight when ``-t`` ends. Also the p99 of how late a
    request left after its scheduled arrival (the user pool keeping up)."""
    rate, late = 0.0, []
    for path in sorted(out.glob("requests*.csv")):
        with path.open(encoding="utf-8", newline="") as fh:
            rows = list(csv.DictReader(fh))
        starts = sorted(float(r["start"]) for r in rows)
        if len(starts) > 1 and starts[-1] > starts[0]:
            rate += (len(starts) - 1) / (starts[-1] - starts[0])
        late += [float(r.get("lateness") or 0) for r in rows]
    late.sort()
    p99 = late[min(len(late) - 1, int(0.99 * len(late)))] if late else 0.0
    return {"arrival_rate_req_s": rate, "lateness_p99_ms": p99 * 1000}


def markdown(s: Mapping[str, Any]) -> str:
    lines = [
        f"# Locust through the gateway: {s['rate_req_s']:.1f} req/s reached of {s['target_qps']:g} "
        f"targeted, {s['requests']} requests in {s['duration_s']:g} s, {s['failures']} failed",
        "",
        f"Requests left at {s.get('arrival_rate_req_s', 0):.1f} req/s while the load ran (from the "
        "per-request rows: each process's requests over its first-to-last start; the figure above "
        f"divides by the whole -t, start-up included); p99 of a request's lateness after its "
        f"scheduled arrival {s.get('lateness_p99_ms', 0):.0f} ms.",
        "",
        f"Host: {s.get('cores', '?')} cores; {s.get('pairs', '?')} emulated pairs, "
        f"{s.get('gateways', '?')} gateway replicas (requests each: {s.get('requests_by_gateway', '?')}), "
        f"{s.get('locust_processes', '?')} Locust processes, answers of at most "
        f"{s.get('max_tokens_cap', '?')} tokens. Times in ms (Locust's histogram: 1 ms "
        "resolution below 100 ms, 10 ms below 1 s).",
        "",
        f"Cores busy during the load: {s.get('cpu_cores_busy', '?')}.",
        "",
        "| metric | count | mean | p50 | p90 | p95 | p99 | max |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for m in METRICS:
        d = s["distributions_ms"][m]
        if not d.get("count"):
            lines.append(f"| {m} | 0 | | | | | | |")
            continue
        cells = " | ".join(f"{d[k]:.1f}" for k in ("mean", "p50", "p90", "p95", "p99", "max"))
        lines.append(f"| {m} | {d['count']} | {cells} |")
    return "\n".join(lines) + "\n"


async def gateway_requests(url: str) -> int:
    """Requests a gateway replica answered (its ``specgate_requests_total``)."""
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        text = await r.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("specgate_requests_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


def cpu_s(pid: int | None) -> float:
    """CPU seconds of a process and every process it started."""
    if pid is None:
        return 0.0
    return sum(process_cpu_s(p) or 0.0 for p in [pid, *child_pids(pid, recursive=True)])


async def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    cores = os.cpu_count() or 1
    n_pairs, n_procs = _auto(args.pairs, cores), _auto(args.processes, cores)
    n_gws = _auto(args.gateways, cores, per=8)
    pairs = [(free_port(), free_port()) for _ in range(n_pairs)]
    # the children run this checkout's gateway, whatever the environment has installed
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    gw_ports = [free_port() for _ in range(n_gws)]
    for i, port in enumerate(gw_ports):
        cfg = out / f"gateway{i}.yaml"
        cfg.write_text(yaml.safe_dump(gateway_config(port, pairs)), encoding="utf-8")
    emus = [
        Proc(
            f"emulator{i}",
            ["emulate", "--pair", "--spec-port", str(sp), "--base-port", str(bp), "--device", f"gpu{i}"],
            str(out / f"emulator{i}.log"),
            env,
        )
        for i, (sp, bp) in enumerate(pairs)
    ]
    gws = [
        Proc(
            f"gateway{i}",
            ["serve", "--config", str(out / f"gateway{i}.yaml"), "--log-level", "WARNING"],
            str(out / f"gateway{i}.log"),
            env,
        )
        for i in range(n_gws)
    ]
    gw_urls = [f"http://127.0.0.1:{port}" for port in gw_ports]
    cmd = [
        sys.executable,  # Locust as a module: no console script needed where it is installed
        "-m",
        "locust",
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "--only-summary",
        "-H",
        ",".join(gw_urls),  # each Locust user keeps one replica
        "-t",
        f"{args.duration:g}s",
        "--qps",
        f"{args.qps:g}",
        "--mix",
        args.mix,
        "--max-tokens-cap",
        str(args.max_tokens_cap),
        "--csv",
        str(out / "locust"),
        "--json-file",
        str(out / "locust"),
        "--specgate-requests-csv",
        str(out / "requests.csv"),
    ]
    if n_procs > 1:
        cmd += ["--processes", str(n_procs)]
    started: list[Proc] = []
    try:
        for emu, (sp, bp) in zip(emus, pairs, strict=True):
            started.append(emu)
            await emu.start()
            await emu.wait_ready(f"http://127.0.0.1:{sp}/health")
            await emu.wait_ready(f"http://127.0.0.1:{bp}/health")
        for gw, url in zip(gws, gw_urls, strict=True):
            started.append(gw)
            await gw.start()
            await gw.wait_ready(f"{url}/ready")
        procs = {"emulators": [e.proc for e in emus], "gateways": [gw.proc for gw in gws]}
        before = {k: sum(cpu_s(p.pid if p else None) for p in v) for k, v in procs.items()}
        log = os.open(out / "locust.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            proc = await asyncio.create_subprocess_exec(
                *cmd, stdout=log, stderr=asyncio.subprocess.STDOUT, env={**os.environ, **env}
            )
        finally:
            os.close(log)
        # CPU of Locust's processes, read while they live (its workers exit with it)
        locust_cpu = 0.0
        while True:
            try:
                rc = await asyncio.wait_for(proc.wait(), 1.0)
                break
            except TimeoutError:
                locust_cpu = max(locust_cpu, cpu_s(proc.pid))
        cpu = {k: sum(cpu_s(p.pid if p else None) for p in v) - before[k] for k, v in procs.items()}
        cpu["locust"] = locust_cpu
        served = [await gateway_requests(url) for url in gw_urls]
    finally:
        for p in reversed(started):
            await p.stop()
    entries = json.loads((out / "locust.json").read_text(encoding="utf-8"))
    s = summarise(entries, args.duration, args.qps)
    s |= arrivals(out)
    s |= {
        "cores": cores,
        "pairs": n_pairs,
        "gateways": n_gws,
        "requests_by_gateway": served,
        "locust_processes": n_procs,
        "max_tokens_cap": args.max_tokens_cap,
    }
    s["locust_exit"] = rc
    # CPU seconds a second of load, per part: which one a larger host needs more cores for
    s["cpu_cores_busy"] = {k: round(v / args.duration, 2) for k, v in cpu.items()}
    (out / "summary.json").write_text(json.dumps(s, indent=2) + "\n", encoding="utf-8")
    (out / "summary.md").write_text(markdown(s), encoding="utf-8")
    print(markdown(s))
    ok = s["failures"] == 0 and s["arrival_rate_req_s"] >= args.min_rate_share * args.qps
    return 0 if ok else 1


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--qps", type=float, default=200.0, help="target request rate (default %(default)s)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load (default %(default)s)")
    p.add_argument(
        "--pairs", default="auto", help="emulated pairs, one process each (default: cores / 4, 1-4)"
    )
    p.add_argument(
        "--gateways", default="auto", help="gateway replicas, each alone (default: cores / 8, 1-4)"
    )
    p.add_argument("--processes", default="auto", help="Locust worker processes (default: cores / 4, 1-4)")
    p.add_argument("--mix", default="chat=1", help="request kinds (locustfile --mix; default %(default)s)")
    p.add_argument("--max-tokens-cap", type=int, default=32, help="longest answer (default %(default)s)")
    p.add_argument("--min-rate-share", type=float, default=0.95, help="rate reached / target to pass")
    p.add_argument("--out", default="out/loadtest", help="output directory (default %(default)s)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    return asyncio.run(run(args))


if __name__ == "__main__":
    raise SystemExit(main())
