#!/usr/bin/env python3
"""Fuzz benchmark: ≥ 10,000 hypothesis-generated hostile requests against ``specgate serve``.

The emulated spec+base pair runs in this process (a background event loop, emulated time
sped up); the gateway runs as a real ``specgate serve`` process in front of it. Cases come
from ``tests/fuzz/hostile.py`` (the same strategies as the CI test, which runs a few
hundred): hostile JSON fields (NaN, ±inf, negative, huge, wrong types), random JSON,
random bytes, truncated JSON, invalid UTF-8, unpaired surrogates, nesting up to 200,000
deep, 5000-digit numbers, hostile header values (request ids, route override, auth,
content type, traceparent), wrong methods and paths.

Every answer must hold the property of ``tests.fuzz.hostile.check``: no 5xx, no
traceback or Python internals in the body, OpenAI-shaped 4xx errors, complete 200s,
sanitised request ids. Violations are collected (not stopped at); the gateway must
still be alive and serving afterwards, with no traceback in its log.

    .venv/bin/python loadtests/fuzz_bench.py --cases 10000 --out fuzz.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import Future
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the strategies live with the tests

import yaml  # noqa: E402
from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from specgate_lab.bench.procs import emulated_pair_model  # noqa: E402
from specgate_lab.emulator.launch import EmulatorGroup, pair_launches, start_group  # noqa: E402
from tests.fuzz.hostile import Case, cases, check, send  # noqa: E402

SPEC, BASE = "qwen3-8b-spec", "qwen3-8b-base"


class EmulatorThread:
    """The emulated pair on an event loop of its own thread."""

    def __init__(self, time_scale: float) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        fut: Future[EmulatorGroup] = asyncio.run_coroutine_threadsafe(
            start_group(
                pair_launches(port_spec=0, port_base=0, name_spec=SPEC, name_base=BASE), time_scale=time_scale
            ),
            self.loop,
        )
        self.group = fut.result(30)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.group.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def start_gateway(group: EmulatorGroup, tmp: Path) -> tuple[subprocess.Popen[bytes], int, Path]:
    spec_url, base_url = group.urls
    cfg = {
        "server": {"host": "127.0.0.1", "port": 0},
        "scrape": {"interval_s": 1.0},
        "models": [
            emulated_pair_model(
                spec_url, base_url, spec_served=SPEC, base_served=BASE, routing={"policy": "adaptive"}
            )
        ],
    }
    (tmp / "gateway.yaml").write_text(yaml.safe_dump(cfg))
    log = tmp / "gateway.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway",
            "serve",
            "--config",
            str(tmp / "gateway.yaml"),
            "--log-level",
            "INFO",
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=log.open("wb"),
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = re.search(r"listening on http://[^:]+:(\d+)", log.read_text(errors="replace"))
        if m:
            return proc, int(m.group(1)), log
        if proc.poll() is not None:
            raise SystemExit(f"gateway exited: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("gateway did not start")


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:"))


def run(args: argparse.Namespace) -> dict[str, Any]:
    emu = EmulatorThread(args.time_scale)
    tmp = Path(tempfile.mkdtemp(prefix="specgate-fuzz-"))
    proc, port, log = start_gateway(emu.group, tmp)
    statuses: Counter[int] = Counter()
    kinds: Counter[str] = Counter()
    violations: list[str] = []
    n = 0
    t0 = time.monotonic()
    rss0 = rss_kib(proc.pid)

    @seed(args.seed)
    @settings(
        max_examples=args.cases,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(cases())
    def prop(case: Case) -> None:
        nonlocal n
        n += 1
        try:
            status, headers, body = send("127.0.0.1", port, case)
        except OSError as exc:
            violations.append(f"{case!r}: connection error {type(exc).__name__}: {exc}")
            return
        statuses[status] += 1
        kinds["stream" if headers.get("content-type", "").startswith("text/event-stream") else "json"] += 1
        try:
            check(case, status, headers, body)
        except (AssertionError, ValueError, KeyError, TypeError) as exc:
            violations.append(f"{case!r}: {exc}"[:600])
        if args.progress and n % args.progress == 0:
            print(f"{n} cases, {time.monotonic() - t0:.0f}s, statuses {dict(statuses)}", flush=True)

    try:
        prop()
        elapsed = time.monotonic() - t0
        alive = proc.poll() is None
        ok_after = (
            alive
            and send(
                "127.0.0.1",
                port,
                Case(
                    "/v1/chat/completions",
                    b'{"model":"m1","messages":[{"role":"user","content":"hi"}],"max_tokens":3}',
                ),
            )[0]
            == 200
        )
        rss1 = rss_kib(proc.pid) if alive else 0
    finally:
        proc.terminate()
        rc = proc.wait(30)
        emu.stop()
    text = log.read_text(errors="replace")
    return {
        "cases": n,
        "seconds": round(elapsed, 1),
        "cases_per_s": round(n / elapsed, 1),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "answers": dict(kinds),
        "violations": len(violations),
        "violation_examples": violations[:20],
        "gateway_alive_after": alive,
        "gateway_serves_after": ok_after,
        "gateway_rss_kib_before_after": [rss0, rss1],
        "gateway_log_tracebacks": text.count("Traceback"),
        "gateway_exit_code": rc,
        "passed": not violations and ok_after and "Traceback" not in text and rc == 0,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", type=int, default=10_000, help="hypothesis examples to send (default 10000)")
    p.add_argument("--seed", type=int, default=1, help="hypothesis seed (default 1)")
    p.add_argument("--time-scale", type=float, default=0.001, help="emulated time speed-up (default 0.001)")
    p.add_argument("--progress", type=int, default=1000, help="print progress every N cases (0: never)")
    p.add_argument("--out", default="fuzz.json", help="JSON report path")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: stop the gateway we started
    res = run(args)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != "violation_examples"}, indent=1))
    for v in res["violation_examples"]:
        print("VIOLATION:", v)
    return 0 if res["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
