#!/usr/bin/env python3
"""The attack suite (``loadtests/epp_attack.py``) against each candidate stack's null EPP.

For every stack, attack and connection count: a fresh server process (``stacks.py``, no
Envoy: the attacks speak HTTP/2 to it directly), a well-behaved gRPC client beside it
(one-trip ext_proc exchanges at ``--good-rate`` per second on its own connection, each
given ``--good-timeout`` s), the server's RSS and CPU sampled every 0.1 s, and the attack
run for ``--duration`` s. Reported per cell: how the attacking connections ended (GOAWAY
code, how long the first one lasted, how many were opened and closed), how long the
server's TCP window held the attacker's sends back, the server's RSS growth and CPU (cores)
during the attack, and the good client's answered share and p99.

    python loadtests/epp_stacks/attacks.py --duration 3 --connections 1,16 \\
        --out loadtests/results/epp-stacks-attacks.json
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import grpc

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parents[1]))

import bench_overhead as bo  # noqa: E402
import epp_attack  # noqa: E402
import stacks  # noqa: E402
from bench import rss_mb  # noqa: E402

from specgate_lab.bench.procs import process_cpu_s  # noqa: E402
from tests.epp.extproc_wire import PROCESS, request_body, request_headers  # noqa: E402

GOOD = [
    request_headers(streamed=True, without_waiting=True),
    request_body({"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
]
DEFAULT_STACKS = "hand,h2,grpc-sync,grpc-aio"


class GoodClient(threading.Thread):
    """One-trip exchanges at a fixed rate on one connection of its own, each timed."""

    def __init__(self, port: int, rate: float, timeout: float) -> None:
        super().__init__(daemon=True)
        self.port, self.rate, self.timeout = port, rate, timeout
        self.latencies: list[float] = []
        self.failures = 0
        self.stop = threading.Event()

    def run(self) -> None:
        with grpc.insecure_channel(f"127.0.0.1:{self.port}") as ch:
            call = ch.stream_stream(PROCESS)
            nxt = time.monotonic()
            while not self.stop.is_set():
                t0 = time.perf_counter()
                try:
                    answers = call(iter(GOOD), timeout=self.timeout)
                    next(answers), next(answers)
                    answers.cancel()
                    self.latencies.append(time.perf_counter() - t0)
                except (grpc.RpcError, StopIteration):
                    self.failures += 1
                nxt += 1.0 / self.rate
                self.stop.wait(max(0.0, nxt - time.monotonic()))

    def summary(self) -> dict[str, Any]:
        lat = sorted(self.latencies)
        n = len(lat) + self.failures
        return {
            "good_sent": n,
            "good_answered_share": len(lat) / n if n else float("nan"),
            "good_p50_ms": statistics.median(lat) * 1e3 if lat else float("nan"),
            "good_p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e3 if lat else float("nan"),
        }


def _cell(stack: str, attack: str, conns: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    pf = tmp / f"{stack}-{attack}-{conns}.port"
    server = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "stacks.py"),
            "--stack",
            stack,
            "--endpoint",
            "127.0.0.1:9",
            "--port-file",
            str(pf),
        ]
    )
    try:
        port = bo._wait_port_file(pf)
        good = GoodClient(port, args.good_rate, args.good_timeout)
        good.start()
        time.sleep(0.5)
        rss0, cpu0 = rss_mb(server.pid), process_cpu_s(server.pid) or 0.0
        peak_rss = rss0
        out = tmp / f"{stack}-{attack}-{conns}.json"
        cmd = [sys.executable, str(HERE.parent / "epp_attack.py"), "attack", "--target", f"127.0.0.1:{port}"]
        cmd += ["--attack", attack, "--duration", str(args.duration), "--connections", str(conns)]
        cmd += ["--body-mb", str(args.body_mb), "--out", str(out)]
        t0 = time.monotonic()
        attacker = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        while attacker.poll() is None:
            if server.poll() is None:
                peak_rss = max(peak_rss, rss_mb(server.pid))
            time.sleep(0.1)
        wall = time.monotonic() - t0
        cpu = ((process_cpu_s(server.pid) or cpu0) - cpu0) / wall
        good.stop.set()
        good.join(args.good_timeout + 2)
        res = json.loads(out.read_text()) if out.exists() else {"conns": []}
        # A send that failed (the server closed the socket) counts as closed by the server; a
        # connect that failed ("connect: ...") as refused.
        refused = [c for c in res["conns"] if (c.get("error") or "").startswith("connect")]
        closed = [c for c in res["conns"] if c["closed_at"] is not None and c not in refused]
        to_close = [c["closed_at"] - c["opened_at"] for c in closed]
        return {
            "stack": stack,
            "attack": attack,
            "connections": conns,
            "server_alive": server.poll() is None,
            "attack_conns_opened": len(res["conns"]) - len(refused),
            "attack_conns_refused": len(refused),
            "attack_stalled_s": sum(c.get("stalled_s", 0.0) for c in res["conns"]),
            "attack_conns_closed": len(closed),
            "goaway_codes": sorted({c["goaway"] for c in closed if c["goaway"] is not None}),
            # the first connection the attack opened: how long it lasted (None: never closed);
            # later ones may be closed at once by a cool-down the first one earned
            "first_close_s": _lasted(res["conns"], refused),
            "median_close_s": statistics.median(to_close) if to_close else None,
            "first_conns": res["conns"][:3],
            "frames_per_s": res.get("frames_per_s"),
            "rst_codes": _merged(c.get("rst_codes", {}) for c in res["conns"]),
            "rss_growth_mb": peak_rss - rss0,
            "server_cpu_cores": cpu,
            **good.summary(),
        }
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def _lasted(conns: list[dict[str, Any]], refused: list[dict[str, Any]]) -> float | None:
    accepted = sorted((c for c in conns if c not in refused), key=lambda c: c["opened_at"])
    if not accepted or accepted[0]["closed_at"] is None:
        return None
    return float(accepted[0]["closed_at"] - accepted[0]["opened_at"])


def _merged(dicts: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def _fmt(x: Any, spec: str = ".2f") -> str:
    return "–" if x is None or x != x else format(x, spec)


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| attack | conns | stack | closed / opened (refused) | GOAWAY | first lasted s | sends held s "
        "| RSS +MB | CPU cores | good answered | good p99 ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        goaway = ",".join(hex(c) for c in r["goaway_codes"]) or "–"
        lines.append(
            f"| {r['attack']} | {r['connections']} | {r['stack']} | {r['attack_conns_closed']} / "
            f"{r['attack_conns_opened']} ({r['attack_conns_refused']}) | {goaway} | "
            f"{_fmt(r['first_close_s'], '.3f')} | {_fmt(r['attack_stalled_s'], '.1f')} | "
            f"{_fmt(r['rss_growth_mb'], '.0f')} | {_fmt(r['server_cpu_cores'])} | "
            f"{_fmt(r['good_answered_share'] * 100, '.0f')} % | {_fmt(r['good_p99_ms'], '.1f')} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stacks", default=DEFAULT_STACKS)
    ap.add_argument("--attacks", default=",".join(epp_attack.ATTACKS))
    ap.add_argument("--connections", default="1,16", help="comma list of attacking connection counts")
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per attack")
    ap.add_argument("--body-mb", type=int, default=800, help="zero_window's passthrough body")
    ap.add_argument("--good-rate", type=float, default=20.0, help="the good client's exchanges per second")
    ap.add_argument("--good-timeout", type=float, default=1.0, help="seconds each good exchange is given")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    rows = []
    with tempfile.TemporaryDirectory(prefix="specgate-epp-stacks-attacks-") as tmp:
        for attack in args.attacks.split(","):
            for conns in (int(c) for c in args.connections.split(",")):
                for stack in args.stacks.split(","):
                    r = _cell(stack, attack, conns, args, Path(tmp))
                    rows.append(r)
                    print(json.dumps(r), file=sys.stderr, flush=True)
    text = table(rows)
    print(text)
    if args.out:
        doc = {
            "started_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "versions": stacks.versions(),
            "args": vars(args),
            "rows": rows,
            "table_markdown": text,
        }
        Path(args.out).write_text(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
