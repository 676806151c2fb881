"""GPU step-time physics shared by the emulator and the routing core.

``get_profile(name).step_ms(batch, q, ctx)`` is the step time T of one engine step (a
profile fitted by ``specgate profile-fit`` is named by its file's path);
:data:`SHARED_DEVICE_EFFICIENCY` says how much of a GPU two time-sliced engines get.
"""

from gateway.physics.catalog import get_profile
from gateway.physics.fitted import FitParams, FittedProfile, load_fitted
from gateway.physics.profile import (
    PROFILE_NAMES,
    Grid,
    GridProfile,
    RooflineProfile,
    StepTimeProfile,
    calibration_rows,
    decode_grid,
)
from gateway.physics.shared import SHARED_DEVICE_EFFICIENCY, SharedScenario, shared_gpu_scenarios

__all__ = [
    "PROFILE_NAMES",
    "SHARED_DEVICE_EFFICIENCY",
    "FitParams",
    "FittedProfile",
    "Grid",
    "GridProfile",
    "RooflineProfile",
    "SharedScenario",
    "StepTimeProfile",
    "calibration_rows",
    "decode_grid",
    "get_profile",
    "load_fitted",
    "shared_gpu_scenarios",
]
