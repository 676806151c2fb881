"""Helpers for emulator tests: virtual-time runs and in-process servers on ephemeral ports."""

from __future__ import annotations

from specgate_lab.emulator.device import Device
from specgate_lab.emulator.engine import Engine, EngineRequest

NGRAM5 = '{"method":"ngram","num_speculative_tokens":5,"prompt_lookup_min":2,"prompt_lookup_max":5}'


def run_sequential(dev: Device, eng: Engine, reqs: list[EngineRequest], t0: float = 0.0) -> float:
    """Concurrency 1 in virtual time: each request starts when the previous one ends."""
    t = t0
    for req in reqs:
        dev.submit(eng, req, t)
        while req.finish_reason is None:
            nxt = dev.next_event_time()
            assert nxt is not None, "engine idle with a request unfinished"
            dev.run_until(nxt)
        t = dev.t
    return t


def run_all(dev: Device) -> None:
    while (t := dev.next_event_time()) is not None:
        dev.run_until(t)
