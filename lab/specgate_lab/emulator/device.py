"""A GPU timeline shared by engines, clocks, and the real-time driver.

:class:`Device` is pure and event-driven: engines attached to one device step on one
GPU. While ``n`` engines have a step in flight the GPU is time-sliced between them
(processor sharing): each progresses at ``efficiency / n`` of full speed, so two
batch-1 engines each see ~2.1x their solo step time, as measured on an H200
(``gateway/physics/data/h200-shared-gpu.jsonl``). A solo engine runs at full speed.

Virtual time (the simulator)::

    dev = Device()
    spec, base = Engine(cfg_spec), Engine(cfg_base)
    dev.attach(spec); dev.attach(base)
    spec.add_request(req, now=0.0)
    dev.run_until(0.0)                        # starts the idle engine's first step
    while (t := dev.next_event_time()) is not None:
        for ev in dev.run_until(t):           # TokenEvents in time order
            ...

Always bring the device to ``now`` (``run_until(now)``) before adding a request at
``now``, then call ``run_until(now)`` again so that an idle engine starts stepping.
:meth:`Device.submit` and :meth:`Device.abort` do both.

Real time: :class:`DeviceDriver` runs a device on the asyncio loop against a
:class:`ScaledClock` (emulated seconds = wall seconds / ``time_scale``) and hands
each TokenEvent to its request's ``listener``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable
from typing import Protocol

from gateway.physics import SHARED_DEVICE_EFFICIENCY
from specgate_lab.emulator.engine import Engine, EngineRequest, StepPlan, TokenEvent

_EPS = 1e-12
log = logging.getLogger(__name__)


class Clock(Protocol):
    def now(self) -> float: ...


class VirtualClock:
    """A clock the simulator moves by hand."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def advance_to(self, t: float) -> None:
        self.t = max(self.t, t)


class ScaledClock:
    """Emulated seconds since creation: wall seconds divided by ``time_scale``.

    ``time_scale=2`` makes emulated time run at half the wall-clock speed, so a
    CPU-bound run keeps up; every figure the emulator reports is in emulated time.
    """

    def __init__(self, time_scale: float = 1.0) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be > 0")
        self.time_scale = time_scale
        self._t0 = time.monotonic()

    def now(self) -> float:
        return (time.monotonic() - self._t0) / self.time_scale

    def wall_delay(self, emulated_s: float) -> float:
        return max(0.0, emulated_s) * self.time_scale


class _Slot:
    __slots__ = ("plan", "remaining")

    def __init__(self, plan: StepPlan) -> None:
        self.plan = plan
        self.remaining = plan.duration_s  # GPU-seconds of work left at full speed


class Device:
    """One GPU: serialises (time-slices) the steps of the engines attached to it."""

    def __init__(self, name: str = "gpu0", efficiency: float = SHARED_DEVICE_EFFICIENCY) -> None:
        self.name = name
        self.efficiency = efficiency
        self.engines: list[Engine] = []
        self.t = 0.0
        self._active: dict[Engine, _Slot] = {}
        self.busy_s = 0.0  # wall time during which at least one step was in flight

    def attach(self, engine: Engine) -> Engine:
        if engine not in self.engines:
            self.engines.append(engine)
        return engine

    def detach(self, engine: Engine) -> None:
        """Remove an engine (a dead process): its in-flight step is dropped."""
        if engine in self.engines:
            self.engines.remove(engine)
        self._active.pop(engine, None)

    def _rate(self) -> float:
        n = len(self._active)
        return 1.0 if n <= 1 else self.efficiency / n

    def _advance(self, t: float) -> None:
        dt = t - self.t
        if dt <= 0:
            return
        if self._active:
            r = self._rate() * dt
            for slot in self._active.values():
                slot.remaining -= r
            self.busy_s += dt
        self.t = t

    def _start_idle(self) -> None:
        for eng in self.engines:
            if eng not in self._active and eng.has_work():
                plan = eng.plan_step(self.t)
                if plan is not None:
                    self._active[eng] = _Slot(plan)

    def next_event_time(self) -> float | None:
        """When the next in-flight step completes (None: the device is idle)."""
        if not self._active:
            return None
        rem = min(s.remaining for s in self._active.values())
        return self.t + max(0.0, rem) / self._rate()

    def run_until(self, now: float) -> list[TokenEvent]:
        """Complete every step that ends by ``now`` (starting the next ones); return the events."""
        events: list[TokenEvent] = []
        self._start_idle()
        while self._active:
            t_next = self.next_event_time()
            assert t_next is not None
            if t_next > now + _EPS:
                break
            self._advance(t_next)
            low = min(s.remaining for s in self._active.values())
            done = [e for e, s in self._active.items() if s.remaining <= low + _EPS]
            for eng in done:
                del self._active[eng]
                events.extend(eng.commit_step(self.t))
            self._start_idle()
        self._advance(now)
        return events

    def submit(self, engine: Engine, req: EngineRequest, now: float) -> list[TokenEvent]:
        """Bring the device to ``now``, queue ``req`` on ``engine`` and start it if idle."""
        events = self.run_until(now)
        engine.add_request(req, max(now, self.t))
        events.extend(self.run_until(now))
        return events

    def abort(self, engine: Engine, req: EngineRequest, now: float) -> list[TokenEvent]:
        events = self.run_until(now)
        engine.abort(req, max(now, self.t))
        return events

    def migrate(self, src: Engine, dst: Engine, req: EngineRequest, now: float) -> list[TokenEvent]:
        """Bring the device to ``now`` and move an unfinished request from ``src`` to
        ``dst`` (see :meth:`Engine.release` and :meth:`Engine.adopt`)."""
        events = self.run_until(now)
        if src.release(req):
            dst.adopt(req, max(now, self.t))
        events.extend(self.run_until(now))
        return events

    def in_flight(self, engine: Engine) -> StepPlan | None:
        slot = self._active.get(engine)
        return slot.plan if slot else None


def dispatch(events: Iterable[TokenEvent]) -> None:
    for ev in events:
        cb = ev.request.listener
        if cb is not None:
            cb(ev)


class DeviceDriver:
    """Runs a :class:`Device` in real (scaled) time on the asyncio loop."""

    def __init__(self, device: Device, clock: ScaledClock | None = None) -> None:
        self.device = device
        self.clock = clock or ScaledClock()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.lag_s = 0.0  # moving average of how late events are delivered

    def start(self) -> None:
        if self._task is None:
            self.device.t = max(self.device.t, self.clock.now())
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"device-{self.device.name}"
            )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def now(self) -> float:
        return max(self.clock.now(), self.device.t)

    def _deliver(self, events: list[TokenEvent]) -> None:
        if events:
            # how late (emulated seconds) tokens reach clients: > a few ms means the CPU
            # cannot keep up and --time-scale should go up
            late = self.clock.now() - events[0].time
            self.lag_s = 0.9 * self.lag_s + 0.1 * max(0.0, late)
            dispatch(events)

    def submit(self, engine: Engine, req: EngineRequest) -> None:
        dispatch(self.device.submit(engine, req, self.now()))
        self._wake.set()

    def abort(self, engine: Engine, req: EngineRequest) -> None:
        dispatch(self.device.abort(engine, req, self.now()))
        self._wake.set()

    def poll(self) -> None:
        """Deliver everything due by now (used before reading gauges)."""
        dispatch(self.device.run_until(self.now()))

    async def _run(self) -> None:
        dev = self.device
        while True:
            self._wake.clear()
            try:
                self._deliver(dev.run_until(self.now()))
            except Exception:  # a bug must not silently stop every engine on the device
                log.exception("emulated device %s: step failed", dev.name)
                await asyncio.sleep(0.01)
                continue
            t = dev.next_event_time()
            if t is None:
                await self._wake.wait()
                continue
            delay = self.clock.wall_delay(t - self.clock.now())
            if delay > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), delay)
