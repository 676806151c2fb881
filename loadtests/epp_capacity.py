#!/usr/bin/env python3
"""Capacity of one specgate process as a proxy and as an Endpoint Picker, driven by a C client.

``bench_overhead.py`` measures whole paths (Envoy included) on one machine, where Envoy's
own ext_proc client shares the cores. This measures the decision point alone: one
``specgate serve`` process with the EPP on, a fast upstream (``bench_overhead.py``'s) for
the proxy path, and nghttp2's ``h2load`` (Debian package nghttp2-client) as the client:
HTTP/1.1 chat requests to the proxy, and to the EPP the ext_proc messages Envoy sends per
request on one gRPC stream each: request headers and body (the bootstrap ``specgate
envoy-config`` writes: the response headers of the answers the EPP does not watch are
skipped), and the same with the response headers (every answer watched, as on an Envoy
configured to send them). Rounds alternate the three; each prints req/s and specgate's CPU
per request.

    python loadtests/epp_capacity.py [--requests 20000] [--rounds 3] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "loadtests"))

from bench_overhead import GATEWAY_CONF, _free_port, _wait_http  # noqa: E402

from specgate_lab.bench.procs import process_cpu_s  # noqa: E402
from tests.epp.extproc_wire import request_body, request_headers, response_headers  # noqa: E402

BODY = {
    "model": "bench",
    "messages": [{"role": "user", "content": "Say ok sixteen times."}],
    "max_tokens": 16,
    "temperature": 0.7,
    "stream": False,
}


def _grpc(message: bytes) -> bytes:
    return b"\x00" + len(message).to_bytes(4, "big") + message


def _h2load(args: list[str]) -> float:
    out = subprocess.run(["h2load", *args], capture_output=True, text=True, check=True).stdout
    if not re.search(r"(\d+) succeeded, 0 failed", out):
        raise RuntimeError(f"h2load saw failures:\n{out}")
    m = re.search(r"finished in [\d.]+m?s, ([\d.]+) req/s", out)
    assert m is not None, out
    return float(m.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=20_000, help="requests per measurement")
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of both measurements")
    ap.add_argument("--policy", default="always-base")
    ap.add_argument("--out", help="write the results as JSON here")
    args = ap.parse_args()
    if shutil.which("h2load") is None:
        print("h2load not found: apt-get install nghttp2-client", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="specgate-capacity-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        pf = tmp / "up.port"
        bench = str(ROOT / "loadtests" / "bench_overhead.py")
        procs.append(subprocess.Popen([sys.executable, bench, "--role", "upstream", "--port-file", str(pf)]))
        while not pf.exists() or not pf.read_text():
            time.sleep(0.05)
        port, epp = _free_port(), _free_port()
        cfg = tmp / "gateway.yaml"
        conf = GATEWAY_CONF.format(
            port=port, up=pf.read_text(), policy=args.policy, telemetry="{}", epp="true", epp_port=epp
        )
        cfg.write_text(conf)
        cmd = [sys.executable, "-m", "gateway", "serve", "--config", str(cfg), "--log-level", "WARNING"]
        procs.append(subprocess.Popen(cmd, stderr=subprocess.DEVNULL))
        pid = procs[-1].pid
        _wait_http(f"http://127.0.0.1:{port}/ready")
        body, ext, watched = tmp / "body.json", tmp / "ext_proc.bin", tmp / "ext_proc_watched.bin"
        body.write_text(json.dumps(BODY))
        ext.write_bytes(_grpc(request_headers()) + _grpc(request_body(BODY)))
        watched.write_bytes(ext.read_bytes() + _grpc(response_headers(200)))
        grpc = ["-H", "content-type: application/grpc", "-H", "te: trailers"]
        process = f"http://127.0.0.1:{epp}/envoy.service.ext_proc.v3.ExternalProcessor/Process"
        n = str(args.requests)
        runs = {
            "proxy (HTTP/1.1, 32 connections)": [
                "--h1", "-n", n, "-c", "32", "-d", str(body), "-H", "content-type: application/json",
                f"http://127.0.0.1:{port}/v1/chat/completions",
            ],
            "EPP (ext_proc, 4 connections x 16 streams)": [
                "-n", n, "-c", "4", "-m", "16", "-d", str(ext), *grpc, process,
            ],
            "EPP, every answer watched": [
                "-n", n, "-c", "4", "-m", "16", "-d", str(watched), *grpc, process,
            ],
        }  # fmt: skip
        results: list[dict[str, Any]] = []
        for r in range(args.rounds):
            for name, h2args in runs.items():
                c0 = process_cpu_s(pid) or 0.0
                rps = _h2load(h2args)
                cpu = ((process_cpu_s(pid) or 0.0) - c0) / args.requests * 1e6
                results.append({"round": r, "path": name, "req_per_s": rps, "cpu_us_per_req": cpu})
                print(f"{name:45} {rps:8.0f} req/s  {cpu:6.0f} us/req", flush=True)
        by = {name: [x for x in results if x["path"] == name] for name in runs}
        proxy, eppr, eppw = (sorted(x["req_per_s"] for x in v)[len(v) // 2] for v in by.values())
        print(f"median req/s: EPP / proxy = {eppr / proxy:.2f} (every answer watched: {eppw / proxy:.2f})")
        if args.out:
            Path(args.out).write_text(json.dumps({"policy": args.policy, "results": results}, indent=2))
        return 0
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
