"""Several engines on one GPU: time-slicing, as measured on an H200.

Two processes stepping on one GPU at once are time-sliced and almost fully
serialised (``data/h200-shared-gpu.jsonl``): two batch-1 engines each step at
~2.1x their solo time. The emulator models the device as processor sharing: while
``n`` engines have a step in flight each progresses at ``efficiency / n`` of the
GPU (``1.0`` when alone); :data:`SHARED_DEVICE_EFFICIENCY` is fitted to the
measured scenarios (context switches cost ~4-5 %).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from gateway.physics.profile import calibration_rows

SHARED_DEVICE_EFFICIENCY = 0.955


@dataclass(frozen=True, slots=True)
class SharedWorker:
    tag: str
    batch: int
    q: int
    ms_p50: float


@dataclass(frozen=True, slots=True)
class SharedScenario:
    name: str
    workers: tuple[SharedWorker, ...]


@cache
def shared_gpu_scenarios() -> tuple[SharedScenario, ...]:
    """The measured shared-GPU scenarios (alone and paired) from the package data."""
    out = []
    for row in calibration_rows("h200-shared-gpu.jsonl"):
        workers = tuple(
            SharedWorker(str(w["tag"]), int(w["B"]), int(w["q"]), float(w["ms_p50"])) for w in row["workers"]
        )
        out.append(SharedScenario(str(row["scenario"]), workers))
    return tuple(out)
