"""Start and stop the processes a benchmark needs (emulated engine pair, gateway)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Sequence

import aiohttp


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS considers free right now (bind to 0, read it, release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class Proc:
    """A child process running ``python -m gateway <args>``, its output kept in a log file."""

    def __init__(
        self, name: str, args: Sequence[str], log_path: str, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.args = [sys.executable, "-m", "gateway", *args]
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
