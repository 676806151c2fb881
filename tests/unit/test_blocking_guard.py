"""The suite's blocking-call guard must itself catch blocking calls."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.conftest import BlockingCallDetected


async def test_sleep_on_loop_is_caught() -> None:
    with pytest.raises(BlockingCallDetected):
        time.sleep(0)  # noqa: ASYNC251 - the point of the test


async def test_sleep_in_worker_thread_is_allowed() -> None:
    await asyncio.to_thread(time.sleep, 0)


def test_sleep_outside_loop_is_allowed() -> None:
    time.sleep(0)
