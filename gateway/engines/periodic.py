"""A worker that runs one async step every ``interval_s`` as a single background task.

The interval is measured from the start of one step to the start of the next (a slow
step is not followed by a full extra interval). :meth:`start` is idempotent, :meth:`stop`
cancels the task and waits for it. Used by the metrics scraper and the health checker.
"""

from __future__ import annotations

import asyncio
import contextlib


class PeriodicWorker:
    interval_s: float
    _task: asyncio.Task[None] | None = None

    async def _step(self) -> None:
        """One round of work (subclasses implement it)."""
        raise NotImplementedError

    def _task_name(self) -> str:
        return type(self).__name__

    async def run(self) -> None:
        """Run the step forever at ``interval_s`` (cancel to stop)."""
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await self._step()
            await asyncio.sleep(max(0.0, self.interval_s - (loop.time() - started)))

    def start(self) -> asyncio.Task[None]:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name=self._task_name())
        return self._task

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
