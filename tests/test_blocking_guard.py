"""The suite's blocking-call guard must itself catch blocking calls."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.conftest import STALL_WALL_S, BlockingCallDetected, slow_callback


async def test_sleep_on_loop_is_caught() -> None:
    with pytest.raises(BlockingCallDetected):
        time.sleep(0)  # noqa: ASYNC251 - the point of the test


async def test_sleep_in_worker_thread_is_allowed() -> None:
    await asyncio.to_thread(time.sleep, 0)


def test_sleep_outside_loop_is_allowed() -> None:
    time.sleep(0)


def test_cpu_bound_work_on_the_loop_counts_but_a_descheduled_callback_does_not() -> None:
    assert slow_callback(wall_s=1.6, cpu_s=1.5) is not None  # computing on the loop
    assert slow_callback(wall_s=0.9, cpu_s=0.01) is None  # descheduled on a busy machine
    assert slow_callback(wall_s=STALL_WALL_S + 1, cpu_s=0.0) is not None  # blocking I/O missed
