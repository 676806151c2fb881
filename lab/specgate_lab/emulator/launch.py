"""Start emulated engines in this process: one, a spec+base pair, or a config of several.

Engines that name the same ``device`` share one GPU timeline (one
:class:`~specgate_lab.emulator.device.Device` and its real-time driver). Used by
``specgate emulate``, ``specgate demo`` and tests::

    group = await start_group(pair_launches(port_spec=0, port_base=0))
    spec_url, base_url = group.urls
    ...
    await group.stop()
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import yaml
from aiohttp import web

from specgate_lab.emulator.device import Device, DeviceDriver, ScaledClock
from specgate_lab.emulator.engine import EngineConfig
from specgate_lab.emulator.faults import Faults
from specgate_lab.emulator.server import EmulatedEngine, bound_port, build_engine_app, make_engine, serve_app
from specgate_lab.emulator.spec import parse_spec_config

PAIR_SPEC_CONFIG = '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_min":2,"prompt_lookup_max":5}'


@dataclass
class EngineLaunch:
    config: EngineConfig
    host: str = "127.0.0.1"
    port: int = 8000
    device: str = "gpu0"
    log_stats: bool = True
    per_request_metrics: bool = False
    faults: Faults = field(default_factory=Faults)


@dataclass
class RunningEngine:
    launch: EngineLaunch
    handle: EmulatedEngine
    runner: web.AppRunner
    port: int

    async def restart(self, *, fresh_state: bool = True) -> None:
        """Bring the engine back on the same port, as a supervisor restarts a dead process.

        Kills it first if it is alive. With ``fresh_state`` the new engine starts empty,
        with fresh counters (the counter reset a scraper sees after a real restart) and
        no faults; without, the old state and counters carry on.
        """
        old = self.handle
        await old.crash()
        await self.runner.cleanup()
        if fresh_state:
            old.driver.device.detach(old.engine)
            ln = self.launch
            new = make_engine(
                ln.config,
                old.driver,
                log_stats=ln.log_stats,
                per_request_metrics=ln.per_request_metrics,
                faults=Faults(),
            )
        else:
            new = old
            new.set_faults(Faults().model_dump())
            new.requests_seen = 0
            new.dead = False
        runner, _site = await serve_app(build_engine_app(new), self.launch.host, self.port)
        new.on_crash = process_death(runner)
        self.handle, self.runner = new, runner

    @property
    def url(self) -> str:
        host = self.launch.host
        if host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        return f"http://{host}:{self.port}"


@dataclass
class EmulatorGroup:
    engines: list[RunningEngine]
    drivers: dict[str, DeviceDriver]

    @property
    def urls(self) -> list[str]:
        return [e.url for e in self.engines]

    def by_name(self, served_model_name: str) -> RunningEngine:
        for e in self.engines:
            if e.handle.name == served_model_name:
                return e
        raise KeyError(served_model_name)

    async def stop(self) -> None:
        for e in self.engines:
            await e.runner.cleanup()
        for d in self.drivers.values():
            await d.stop()


def pair_launches(
    *,
    host: str = "127.0.0.1",
    port_spec: int = 8101,
    port_base: int = 8102,
    name_spec: str = "qwen3-8b-spec",
    name_base: str = "qwen3-8b-base",
    speculative_config: str = PAIR_SPEC_CONFIG,
    profile: str = "h200-qwen3-8b",
    max_num_seqs: int = 256,
    max_model_len: int = 4096,
    seed: int = 0,
    device: str = "gpu0",
    per_request_metrics: bool = False,
    num_gpu_blocks: int = 4185,
    spec_cost_scale: float = 1.0,
    reasoning_parser: str | None = None,
    reasoning_field: str = "reasoning",
    reasoning_parser_mode: str = "prompt-aware",
    device_scale: float = 1.0,
) -> list[EngineLaunch]:
    """A speculative and a plain engine of one model on one device timeline (a thinking
    model's with ``reasoning_parser``, see :class:`EngineConfig`)."""
    common: dict[str, Any] = {
        "reasoning_parser": reasoning_parser,
        "reasoning_field": reasoning_field,
        "reasoning_parser_mode": reasoning_parser_mode,
        "model": "Qwen/Qwen3-8B",
        "max_num_seqs": max_num_seqs,
        "max_model_len": max_model_len,
        "profile": profile,
        "seed": seed,
        "num_gpu_blocks": num_gpu_blocks,
        "device_scale": device_scale,
    }
    return [
        EngineLaunch(
            EngineConfig(
                served_model_name=name_spec,
                spec=parse_spec_config(speculative_config),
                spec_cost_scale=spec_cost_scale,
                **common,
            ),
            host=host,
            port=port_spec,
            device=device,
            per_request_metrics=per_request_metrics,
        ),
        EngineLaunch(
            EngineConfig(served_model_name=name_base, **common), host=host, port=port_base, device=device
        ),
    ]


async def start_group(
    launches: list[EngineLaunch], *, time_scale: float = 1.0, startup_delay_s: float = 0.0
) -> EmulatorGroup:
    """Start every engine (sharing drivers per device name) and listen on their ports."""
    drivers: dict[str, DeviceDriver] = {}
    clock = ScaledClock(time_scale)
    handles = []
    for ln in launches:
        drv = drivers.get(ln.device)
        if drv is None:
            drv = drivers[ln.device] = DeviceDriver(Device(ln.device), clock)
        handles.append(
            make_engine(
                ln.config,
                drv,
                log_stats=ln.log_stats,
                per_request_metrics=ln.per_request_metrics,
                faults=ln.faults.model_copy(),
            )
        )
    for drv in drivers.values():
        drv.start()
    delay = max([startup_delay_s] + [ln.faults.startup_delay_s for ln in launches])
    if delay > 0:
        await asyncio.sleep(delay)  # like vLLM loading weights: the port is not open yet
    running: list[RunningEngine] = []
    try:
        for ln, h in zip(launches, handles, strict=True):
            runner, _site = await serve_app(build_engine_app(h), ln.host, ln.port)
            r = RunningEngine(ln, h, runner, bound_port(runner))
            h.on_crash = process_death(runner)
            running.append(r)
    except BaseException:
        for r in running:
            await r.runner.cleanup()
        for d in drivers.values():
            await d.stop()
        raise
    return EmulatorGroup(running, drivers)


def process_death(runner: web.AppRunner) -> Callable[[], Awaitable[None]]:
    """An engine's ``on_crash``: what a process death does to its server."""

    async def close() -> None:
        # Like a dead process: stop listening (new connections are refused) and drop
        # every open connection, idle keep-alive ones included.
        for site in list(runner.sites):
            await site.stop()
        server = runner.server
        for conn in list(server.connections) if server is not None else []:
            tr = conn.transport
            if tr is not None:
                tr.abort()

    return close


def _cost_scale(v: object) -> float:
    """A YAML spec_cost_scale as a float (NaN, refused by EngineConfig, for what is not a number)."""
    try:
        return float(v) if isinstance(v, (int, float, str)) else math.nan
    except ValueError:
        return math.nan


def load_config(path: str) -> tuple[list[EngineLaunch], float]:
    """Engines from a YAML file::

    time_scale: 1.0
    engines:
      - served_model_name: qwen3-8b-spec
        port: 8101
        device: gpu0
        speculative_config: {method: ngram, num_speculative_tokens: 5, prompt_lookup_min: 2}
        profile: h200-qwen3-8b
        max_num_seqs: 256
        spec_cost_scale: 1.0  # what speculation adds to a step, x the profile's price
        reasoning_parser: qwen3  # a thinking model (default: none)
        reasoning_field: reasoning  # or reasoning_content (older vLLM)
        reasoning_parser_mode: prompt-aware  # or generated-only (older vLLM)
      - served_model_name: qwen3-8b-base
        port: 8102
        device: gpu0
    """
    with open(path, encoding="utf-8") as fh:
        data = yaml.safe_load(fh) or {}
    if not isinstance(data, dict) or not isinstance(data.get("engines"), list) or not data["engines"]:
        raise ValueError(f"{path}: expected a mapping with a non-empty 'engines' list")
    allowed = {
        "served_model_name",
        "model",
        "port",
        "host",
        "device",
        "speculative_config",
        "profile",
        "max_num_seqs",
        "max_model_len",
        "max_num_batched_tokens",
        "seed",
        "num_gpu_blocks",
        "spec_cost_scale",
        "reasoning_parser",
        "reasoning_field",
        "reasoning_parser_mode",
        "disable_log_stats",
        "per_request_spec_decode_metrics",
        "faults",
    }
    launches = []
    for i, e in enumerate(data["engines"]):
        if not isinstance(e, dict):
            raise ValueError(f"{path}: engines[{i}] must be a mapping")
        unknown = set(e) - allowed
        if unknown:
            raise ValueError(f"{path}: engines[{i}]: unknown keys {sorted(unknown)}")
        cfg = EngineConfig(
            served_model_name=str(e.get("served_model_name", f"engine-{i}")),
            model=str(e.get("model", "Qwen/Qwen3-8B")),
            spec=parse_spec_config(e.get("speculative_config")),
            max_num_seqs=int(e.get("max_num_seqs", 256)),
            max_model_len=int(e.get("max_model_len", 4096)),
            max_num_batched_tokens=int(e.get("max_num_batched_tokens", 8192)),
            profile=str(e.get("profile", "h200-qwen3-8b")),
            seed=int(e.get("seed", 0)),
            num_gpu_blocks=int(e.get("num_gpu_blocks", 4185)),
            spec_cost_scale=_cost_scale(e.get("spec_cost_scale", 1.0)),
            reasoning_parser=e.get("reasoning_parser"),
            reasoning_field=e.get("reasoning_field", "reasoning"),
            reasoning_parser_mode=e.get("reasoning_parser_mode", "prompt-aware"),
        )
        launches.append(
            EngineLaunch(
                cfg,
                host=str(e.get("host", "127.0.0.1")),
                port=int(e.get("port", 8000 + i)),
                device=str(e.get("device", "gpu0")),
                log_stats=not bool(e.get("disable_log_stats", False)),
                per_request_metrics=e.get("per_request_spec_decode_metrics") == "summary",
                faults=Faults.model_validate(e.get("faults") or {}),
            )
        )
    return launches, float(data.get("time_scale", 1.0))
