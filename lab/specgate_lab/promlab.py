"""A local observability lab: an emulated engine pair, the gateway and a real Prometheus.

Used by the end-to-end telemetry test and by ``deploy/grafana/render_panel.py``. Everything
listens on loopback, on ports the OS picks; Prometheus (the ``prometheus`` binary, e.g.
from the Debian package) scrapes the gateway and both engines with the same target labels
as ``deploy/prometheus/prometheus.yml`` (``model``, ``engine_name``, ``route``).

The lab also serves a second model, ``flaky``, whose speculative engine (an emulated one
on its own device) answers half of its requests with HTTP 500: they fail over to the
plain engine, so upstream failures and retries are real, not simulated. A third model,
``gone``, has a speculative engine on a closed port: the gateway sees it down.

Nothing here runs on the request path; the emulator is imported only when a lab starts.
It needs the ``dev`` extra (``psutil`` finds the port Prometheus bound).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import shutil
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import yaml
from aiohttp import web

from gateway.config.telemetry import TelemetryConfig
from gateway.telemetry.service import GatewayTelemetry, build_telemetry

log = logging.getLogger("specgate.lab")

MODEL = "qwen3-8b"
FLAKY = "flaky"
GONE = "gone"

_CODE = (
    "Rename the variable `total` to `acc` in this function and return it unchanged otherwise:\n"
    "```python\ndef sum_list(values):\n    total = 0\n    for v in values:\n        total += v\n"
    "    return total\n```"
)
_CHAT = "Write a short poem about autumn leaves and the first frost."


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def listening_ports(pid: int) -> set[int]:
    """TCP ports process ``pid`` listens on, for servers started on port 0 (empty when the
    process is gone or not ours to inspect)."""
    try:
        conns = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.Error:
        return set()
    return {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN and c.laddr}


def prometheus_config(
    gateway: str,
    engines: Sequence[tuple[str, str, str, str]],
    rule_files: Sequence[str] = (),
    interval: str = "1s",
) -> dict[str, Any]:
    """A Prometheus config; ``engines`` are (host:port, model, engine_name, route)."""
    return {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
        "rule_files": list(rule_files),
        "scrape_configs": [
            {"job_name": "specgate", "metrics_path": "/metrics", "static_configs": [{"targets": [gateway]}]},
            {
                "job_name": "vllm",
                "metrics_path": "/metrics",
                "static_configs": [
                    {"targets": [addr], "labels": {"model": model, "engine_name": name, "route": route}}
                    for addr, model, name, route in engines
                ],
            },
        ],
    }


@dataclass
class Lab:
    gateway_url: str
    prometheus_url: str
    config_path: Path
    telemetry: GatewayTelemetry
    _stack: contextlib.AsyncExitStack = field(repr=False)

    async def stop(self) -> None:
        await self._stack.aclose()

    async def query(self, session: aiohttp.ClientSession, expr: str) -> list[dict[str, Any]]:
        """Instant query; raises on a PromQL error."""
        async with session.get(f"{self.prometheus_url}/api/v1/query", params={"query": expr}) as r:
            body = await r.json()
        if body.get("status") != "success":
            raise ValueError(f"{expr}: {body.get('errorType')}: {body.get('error')}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    async def query_range(
        self, session: aiohttp.ClientSession, expr: str, start: float, end: float, step: float
    ) -> list[dict[str, Any]]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        async with session.get(f"{self.prometheus_url}/api/v1/query_range", params=params) as r:
            body = await r.json()
        if body.get("status") != "success":
            raise ValueError(f"{expr}: {body.get('errorType')}: {body.get('error')}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result


def _gateway_config(spec_url: str, base_url: str, flaky_url: str, dead_url: str) -> Any:
    from gateway.config.models import GatewayConfig

    def engine(name: str, url: str, served: str, spec: bool) -> dict[str, Any]:
        e: dict[str, Any] = {"name": name, "url": url, "served_model_name": served}
        if spec:
            e.update(method="ngram", k=5, prompt_lookup_min=2, prompt_lookup_max=5)
        return e

    return GatewayConfig.model_validate(
        {
            "server": {"host": "127.0.0.1", "port": 0},
            "scrape": {"interval_s": 0.5, "timeout_s": 0.5, "stale_after_s": 5.0, "window_s": 10.0},
            "models": [
                {
                    "name": MODEL,
                    "pairs": [
                        {
                            "device": "gpu0",
                            "spec": engine("spec0", spec_url, "qwen3-8b-spec", True),
                            "base": engine("base0", base_url, "qwen3-8b-base", False),
                        }
                    ],
                    "routing": {"policy": "adaptive"},
                },
                {
                    "name": FLAKY,
                    "pairs": [
                        {
                            "device": "gpu0",
                            "spec": engine("flakyspec", flaky_url, "flaky-spec", True),
                            "base": engine("base1", base_url, "qwen3-8b-base", False),
                        }
                    ],
                    "routing": {"policy": "always-spec"},
                },
                {
                    "name": GONE,
                    "pairs": [
                        {
                            "device": "gpu0",
                            "spec": engine("deadspec", dead_url, "qwen3-8b-spec", True),
                            "base": engine("base2", base_url, "qwen3-8b-base", False),
                        }
                    ],
                },
            ],
        }
    )


async def _wait_port(proc: asyncio.subprocess.Process, deadline: float) -> int:
    loop = asyncio.get_running_loop()
    while loop.time() < deadline:
        if proc.returncode is not None:
            raise RuntimeError(f"prometheus exited with {proc.returncode}")
        ports = listening_ports(proc.pid)
        if ports:
            return min(ports)
        await asyncio.sleep(0.1)
    raise TimeoutError("prometheus did not start listening")


async def _wait_ready(url: str, deadline: float) -> None:
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as s:
        while loop.time() < deadline:
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with s.get(f"{url}/-/ready", timeout=aiohttp.ClientTimeout(total=1)) as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.1)
    raise TimeoutError("prometheus did not become ready")


async def start_lab(
    workdir: Path,
    *,
    rule_files: Sequence[str] = (),
    prometheus: str | None = None,
    interval: str = "1s",
    telemetry: TelemetryConfig | None = None,
    start_timeout_s: float = 30.0,
) -> Lab:
    """Start emulated pair + gateway + Prometheus; call :meth:`Lab.stop` to tear down."""
    from gateway.api.app import RUNNER_KWARGS, build_app
    from gateway.peers.bus import MemoryHub
    from specgate_lab.emulator.engine import EngineConfig
    from specgate_lab.emulator.faults import Faults
    from specgate_lab.emulator.launch import PAIR_SPEC_CONFIG, EngineLaunch, pair_launches, start_group
    from specgate_lab.emulator.spec import parse_spec_config

    binary = prometheus or shutil.which("prometheus")
    if binary is None:
        raise FileNotFoundError("the prometheus binary is not installed (apt-get install prometheus)")
    loop = asyncio.get_running_loop()
    stack = contextlib.AsyncExitStack()
    try:
        flaky = EngineLaunch(
            EngineConfig(
                served_model_name="flaky-spec",
                model="Qwen/Qwen3-8B",
                spec=parse_spec_config(PAIR_SPEC_CONFIG),
            ),
            port=0,
            device="gpu1",
            faults=Faults(error_rate=0.5),
        )
        group = await start_group([*pair_launches(port_spec=0, port_base=0), flaky])
        stack.push_async_callback(group.stop)
        spec_url, base_url, flaky_url = group.urls
        cfg = _gateway_config(spec_url, base_url, flaky_url, f"http://127.0.0.1:{closed_port()}")
        tel = build_telemetry(
            telemetry or TelemetryConfig(tracing="off", access_log=False),
            known_models=[m.name for m in cfg.models],
        )
        # a peer channel of one (its metrics, for the dashboard's replica row)
        app = build_app(cfg, telemetry=tel, peer_bus=MemoryHub().bus())
        runner = web.AppRunner(app, **RUNNER_KWARGS)
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        gw_port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
        gateway_url = f"http://127.0.0.1:{gw_port}"

        prom_cfg = prometheus_config(
            f"127.0.0.1:{gw_port}",
            [
                (spec_url.removeprefix("http://"), MODEL, "spec0", "spec"),
                (base_url.removeprefix("http://"), MODEL, "base0", "base"),
                (flaky_url.removeprefix("http://"), FLAKY, "flakyspec", "spec"),
            ],
            rule_files,
            interval,
        )
        config_path = await asyncio.to_thread(_write_config, workdir, prom_cfg)
        proc = await asyncio.create_subprocess_exec(
            binary,
            f"--config.file={config_path}",
            f"--storage.tsdb.path={workdir / 'data'}",
            "--web.listen-address=127.0.0.1:0",
            "--log.level=warn",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        stack.push_async_callback(_terminate, proc)
        deadline = loop.time() + start_timeout_s
        prom_port = await _wait_port(proc, deadline)
        prom_url = f"http://127.0.0.1:{prom_port}"
        await _wait_ready(prom_url, deadline)
        return Lab(gateway_url, prom_url, config_path, tel, stack)
    except BaseException:
        await stack.aclose()
        raise


def _write_config(workdir: Path, cfg: dict[str, Any]) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


async def _terminate(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def _one(session: aiohttp.ClientSession, url: str, model: str, rng: random.Random) -> None:
    kind = rng.random()
    headers: dict[str, str] = {}
    if model == MODEL and kind < 0.3:
        headers["x-specgate-route"] = "spec"
    elif model == MODEL and kind < 0.6:
        headers["x-specgate-route"] = "base"
    copy = rng.random() < 0.6
    body = {
        "model": model,
        "messages": [{"role": "user", "content": _CODE if copy else _CHAT}],
        "max_tokens": rng.choice((24, 48, 64)),
        "temperature": 0.0 if copy else rng.choice((0.0, 0.7, 1.0)),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async with session.post(
            f"{url}/v1/chat/completions", json=body, headers=headers, timeout=aiohttp.ClientTimeout(total=30)
        ) as r:
            async for _ in r.content:
                pass


async def run_load(gateway_url: str, stop: asyncio.Event, *, concurrency: int = 3, seed: int = 0) -> int:
    """Stream mixed requests (forced spec, forced base, auto; 1 in 5 for ``flaky``) until ``stop``."""
    rng = random.Random(seed)
    sent = 0

    async def worker(i: int) -> None:
        nonlocal sent
        async with aiohttp.ClientSession() as session:
            while not stop.is_set():
                model = FLAKY if rng.random() < 0.2 else MODEL
                await _one(session, gateway_url, model, rng)
                sent += 1
                await asyncio.sleep(0.02 * i)

    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return sent


def dumps_result(result: list[dict[str, Any]]) -> str:
    return json.dumps(result)[:500]
