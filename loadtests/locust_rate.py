"""Drive a target request rate through the gateway on emulated engines with Locust, and
write the TTFT, ITL and TPOT distributions and the failure count.

    python loadtests/locust_rate.py --qps 200 --duration 60 --out out/loadtest   # = make loadtest

It starts ``--pairs`` emulated engine pairs (one ``specgate emulate --pair`` process each,
each pair on its own emulated H200, so that the emulator's CPU spreads over cores and its
engines are not what limits the rate), one gateway (``specgate serve``) with one model on
all of those pairs, then Locust headless (``loadtests/locustfile.py``, ``--processes``
worker processes) at ``--qps`` Poisson arrivals of short streamed chat answers
(``--max-tokens-cap``). Outputs in ``--out``: ``summary.json`` and ``summary.md`` (the
rate reached, failures, and per distribution count, mean, p50, p90, p95, p99, max in
ms), Locust's CSVs (``locust_stats.csv``, ...), ``locust.json``, one row per request
(``requests*.csv``) and the processes' logs. Exit status 0 when no request failed and the
rate reached at least ``--min-rate-share`` of the target.

The rate one host can drive depends on its cores: the emulator, the gateway and Locust
share them. ``--pairs auto`` and ``--processes auto`` take a quarter of the cores each
(at least one, at most four). See loadtests/README.md for the rates measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.bench.procs import Proc, emulated_pair_model, free_port  # noqa: E402

LOCUSTFILE = ROOT / "loadtests" / "locustfile.py"
METRICS = ("TTFT", "ITL", "TPOT")
PERCENTILES = (0.5, 0.9, 0.95, 0.99)


def _auto(value: str, cores: int) -> int:
    return max(1, min(4, cores // 4)) if value == "auto" else max(1, int(value))


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


def markdown(s: Mapping[str, Any]) -> str:
    lines = [
        f"# Locust through the gateway: {s['rate_req_s']:.1f} req/s reached of {s['target_qps']:g} "
        f"targeted, {s['requests']} requests in {s['duration_s']:g} s, {s['failures']} failed",
        "",
        f"Host: {s.get('cores', '?')} cores; {s.get('pairs', '?')} emulated pairs, "
        f"{s.get('locust_processes', '?')} Locust processes, answers of at most "
        f"{s.get('max_tokens_cap', '?')} tokens. Times in ms (Locust's histogram: 1 ms "
        "resolution below 100 ms, 10 ms below 1 s).",
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


async def run(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    n_pairs, n_procs = _auto(args.pairs, cores), _auto(args.processes, cores)
    pairs = [(free_port(), free_port()) for _ in range(n_pairs)]
    gw_port = free_port()
    cfg = out / "gateway.yaml"
    cfg.write_text(yaml.safe_dump(gateway_config(gw_port, pairs)), encoding="utf-8")
    emus = [
        Proc(
            f"emulator{i}",
            ["emulate", "--pair", "--spec-port", str(sp), "--base-port", str(bp), "--device", f"gpu{i}"],
            str(out / f"emulator{i}.log"),
        )
        for i, (sp, bp) in enumerate(pairs)
    ]
    gw = Proc("gateway", ["serve", "--config", str(cfg), "--log-level", "WARNING"], str(out / "gateway.log"))
    locust = Path(sys.executable).with_name("locust")
    cmd = [
        str(locust),
        "-f",
        str(LOCUSTFILE),
        "--headless",
        "--only-summary",
        "-H",
        f"http://127.0.0.1:{gw_port}",
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
        started.append(gw)
        await gw.start()
        await gw.wait_ready(f"http://127.0.0.1:{gw_port}/ready")
        with open(out / "locust.log", "wb") as log:
            proc = await asyncio.create_subprocess_exec(*cmd, stdout=log, stderr=asyncio.subprocess.STDOUT)
            rc = await asyncio.wait_for(proc.wait(), args.duration + 120)
    finally:
        for p in reversed(started):
            await p.stop()
    entries = json.loads((out / "locust.json").read_text(encoding="utf-8"))
    s = summarise(entries, args.duration, args.qps)
    s |= {"cores": cores, "pairs": n_pairs, "locust_processes": n_procs, "max_tokens_cap": args.max_tokens_cap}
    s["locust_exit"] = rc
    (out / "summary.json").write_text(json.dumps(s, indent=2) + "\n", encoding="utf-8")
    (out / "summary.md").write_text(markdown(s), encoding="utf-8")
    print(markdown(s))
    ok = s["failures"] == 0 and s["rate_req_s"] >= args.min_rate_share * args.qps
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--qps", type=float, default=200.0, help="target request rate (default %(default)s)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load (default %(default)s)")
    p.add_argument("--pairs", default="auto", help="emulated pairs, one process each (default: cores / 4, 1-4)")
    p.add_argument("--processes", default="auto", help="Locust worker processes (default: cores / 4, 1-4)")
    p.add_argument("--mix", default="chat=1", help="request kinds (locustfile --mix; default %(default)s)")
    p.add_argument("--max-tokens-cap", type=int, default=32, help="longest answer (default %(default)s)")
    p.add_argument("--min-rate-share", type=float, default=0.95, help="rate reached / target to pass")
    p.add_argument("--out", default="out/loadtest", help="output directory (default %(default)s)")
    return asyncio.run(run(p.parse_args(argv)))


if __name__ == "__main__":
    raise SystemExit(main())
