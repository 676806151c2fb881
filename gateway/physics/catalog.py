"""Profiles by name or by file: what ``routing.profile`` and the emulator's ``--profile`` name."""

from __future__ import annotations

from functools import cache

from gateway.physics.fitted import load_fitted
from gateway.physics.profile import StepTimeProfile, named_profile


@cache
def get_profile(name: str) -> StepTimeProfile:
    """A named profile (:data:`~gateway.physics.PROFILE_NAMES`), or the path of a profile
    file that ``specgate profile-fit`` wrote (``*.json``); built once and cached."""
    if name.endswith(".json"):
        return load_fitted(name)
    return named_profile(name)
