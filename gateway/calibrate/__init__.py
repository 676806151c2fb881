"""Calibration of the routing's physics prior on a new GPU or model: a step-time profile
fitted to the engines' own ``/metrics`` (``specgate profile-fit``; docs/profile-fit.md)."""
