"""Suite-wide fixtures.

``_no_blocking_calls`` (autouse) fails any test in which a blocking call runs on a running
event loop: ``time.sleep``, blocking socket connects, synchronous subprocesses (caught at
the call), or any single loop callback that computes on the loop thread for longer than
``SLOW_CALLBACK_CPU_S`` of its CPU time. CPU time, not wall time: on a loaded machine a
callback can be descheduled for a second without doing anything wrong. Only a stall far
past anything scheduling causes (``STALL_WALL_S``) counts by the wall clock: blocking
I/O the patched calls miss.
Code that must block (the sync OpenAI SDK in tests, say) runs in a worker thread,
where it is allowed.
"""

from __future__ import annotations

import asyncio
import asyncio.events
import functools
import socket
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from gateway.config import GatewayConfig, load_config
from specgate_lab.emulator.launch import EmulatorGroup, pair_launches, start_group

# CPU time of the loop thread in one callback (0.5 flagged 0.01-s tests at 0.5-0.8 s on a
# loaded 2-core host)
SLOW_CALLBACK_CPU_S = 1.0
STALL_WALL_S = 5.0  # wall time of one callback


def slow_callback(wall_s: float, cpu_s: float) -> str | None:
    """Why one loop callback counts as blocking, or None."""
    if cpu_s > SLOW_CALLBACK_CPU_S:
        return f"computed on the event loop for {cpu_s:.3f}s of CPU"
    if wall_s > STALL_WALL_S:
        return f"held the event loop for {wall_s:.3f}s"
    return None


def _on_running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class BlockingCallDetected(AssertionError):
    pass


def _guard(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
    def guarded(*args: Any, **kwargs: Any) -> Any:
        if _on_running_loop():
            raise BlockingCallDetected(f"blocking call {name}() on the event loop thread")
        return real(*args, **kwargs)

    return guarded


@pytest.fixture(autouse=True)
def _no_blocking_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for mod, attr in (
        (time, "sleep"),
        (socket, "create_connection"),
        (socket, "getaddrinfo"),
        (subprocess, "run"),
        (subprocess, "check_output"),
        (subprocess, "check_call"),
        (subprocess, "call"),
    ):
        monkeypatch.setattr(mod, attr, _guard(f"{mod.__name__}.{attr}", getattr(mod, attr)))

    slow: list[str] = []
    real_run = asyncio.events.Handle._run
    main_thread = threading.get_ident()

    def timed_run(self: asyncio.events.Handle) -> None:
        t0, c0 = time.perf_counter(), time.thread_time()
        real_run(self)
        why = slow_callback(time.perf_counter() - t0, time.thread_time() - c0)
        if why is not None and threading.get_ident() == main_thread:
            slow.append(f"{self!r} {why}")

    monkeypatch.setattr(asyncio.events.Handle, "_run", timed_run)
    yield
    if slow:
        pytest.fail("blocking work on the event loop:\n" + "\n".join(slow[:5]), pytrace=False)


@pytest.fixture
async def pair() -> AsyncIterator[EmulatorGroup]:
    """A spec+base pair on one device, on ephemeral ports, emulated time 20x faster than wall."""
    group = await start_group(
        pair_launches(port_spec=0, port_base=0, per_request_metrics=True), time_scale=0.05
    )
    try:
        yield group
    finally:
        await group.stop()


@pytest.fixture
async def thinking() -> AsyncIterator[EmulatorGroup]:
    """A pair serving a thinking model (``reasoning_parser: qwen3``), 50x faster than wall."""
    group = await start_group(
        pair_launches(port_spec=0, port_base=0, reasoning_parser="qwen3"), time_scale=0.02
    )
    try:
        yield group
    finally:
        await group.stop()


def gateway_config_for(group: EmulatorGroup, **overrides: Any) -> GatewayConfig:
    """The default gateway config pointed at an emulated pair (ephemeral port, scraping
    every 0.1 s); keyword arguments are further dotted-path overrides."""
    spec, base = group.engines
    return load_config(
        None,
        env={},
        overrides={
            "server.port": 0,
            "models.0.pairs.0.spec.url": spec.url,
            "models.0.pairs.0.base.url": base.url,
            "scrape.interval_s": 0.1,
            "scrape.timeout_s": 1.0,
            # Tests force routes with x-specgate-route: allowed here (off by default).
            "models.0.routing.allow_client_override": True,
            **overrides,
        },
    )


@pytest.fixture
def pair_config(pair: EmulatorGroup) -> Callable[..., GatewayConfig]:
    """:func:`gateway_config_for` ``pair``."""
    return functools.partial(gateway_config_for, pair)
