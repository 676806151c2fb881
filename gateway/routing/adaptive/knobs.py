"""Typed tunables of the adaptive policy's parts.

Each part keeps its tunables in a frozen dataclass of its own (``EstimateKnobs``,
``QuietKnobs``, ...). Every field is declared with :func:`knob`, which records its unit
and one line on why its default is what it is; :func:`knob_rows` reads them back, so the
table in ``docs/routing-core.md`` is generated from the code and cannot drift from it.
The operator-facing tunables are :class:`~gateway.routing.config.RoutingConfig`'s fields
(pydantic, validated); these are the internal ones.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# Decimal places of the figures the policy reports (decisions, /admin/state).
REPORT_DIGITS = 4
TIME_DIGITS = 3  # ...and of times (ms resolution) and tokens per step in the decision log
MS_PER_S = 1000.0


def knob(default: Any, unit: str, why: str) -> Any:
    """A dataclass field with its ``unit`` and the reason for its ``default``."""
    return dataclasses.field(default=default, metadata={"unit": unit, "why": why})


def knob_rows(cls: type) -> list[tuple[str, object, str, str]]:
    """(name, default, unit, why) of each field of a knobs dataclass, in declaration order."""
    return [
        (f.name, f.default, f.metadata.get("unit", ""), f.metadata.get("why", ""))
        for f in dataclasses.fields(cls)
    ]
