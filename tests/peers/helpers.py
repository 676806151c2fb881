"""Shared by the peer channel's tests: a real redis-server, and bounded waits that fail
naming what they waited for (an await without a bound hangs a test until the suite's
timeout, and the dump then shows an idle event loop, not what it waited for)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import TypeVar

from tests.deploy.helpers import require_tool

T = TypeVar("T")

REDIS_EXIT_S = 10.0  # for redis-server to exit after SIGTERM, then again after SIGKILL


async def within(what: str, aw: Awaitable[T], seconds: float = 30.0) -> T:
    """``aw``'s result, or a TimeoutError naming ``what`` after ``seconds``."""
    bound = asyncio.timeout(seconds)
    try:
        async with bound:
            return await aw
    except TimeoutError as exc:
        if not bound.expired():
            raise  # raised by ``aw`` itself
        raise TimeoutError(f"{what}: not done within {seconds:g} s") from exc


@contextlib.asynccontextmanager
async def redis_server(tmp: Path) -> AsyncIterator[str]:
    """A real redis-server on a unix socket (no TCP port to race for); ready when it says
    so, and gone (SIGTERM, then SIGKILL) when the block ends."""
    binary = require_tool("redis-server")
    sock = tmp / "redis.sock"
    proc = await within(
        "starting redis-server",
        asyncio.create_subprocess_exec(
            binary,
            "--port",
            "0",
            "--unixsocket",
            str(sock),
            "--save",
            "",
            "--appendonly",
            "no",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        ),
    )
    out = proc.stdout
    assert out is not None

    async def ready() -> None:
        while b"ready to accept connections" not in (line := await out.readline()).lower():
            assert line, "redis-server exited before it was ready"

    try:
        await within("redis-server to say it is ready", ready(), 20)
        yield f"unix://{sock}"
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                async with asyncio.timeout(REDIS_EXIT_S):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await within(
                    f"redis-server (pid {proc.pid}) to exit after SIGKILL", proc.wait(), REDIS_EXIT_S
                )
