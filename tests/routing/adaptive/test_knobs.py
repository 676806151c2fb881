"""The adaptive policy's tunables: typed, frozen, each with its unit and the reason for its
default, and every one listed in docs/routing-core.md (whose table this module generates:
``python -m tests.routing.adaptive.test_knobs``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gateway.routing.adaptive.calibration import CalibrationKnobs, LatencyBias
from gateway.routing.adaptive.cluster import ClusterKnobs
from gateway.routing.adaptive.context import ContextKnobs
from gateway.routing.adaptive.controller import ControllerKnobs
from gateway.routing.adaptive.estimate import EstimateKnobs
from gateway.routing.adaptive.explore import ExploreKnobs
from gateway.routing.adaptive.knobs import knob_rows
from gateway.routing.adaptive.live import LiveKnobs
from gateway.routing.adaptive.loadlog import LoadLogKnobs
from gateway.routing.adaptive.mix import MixKnobs
from gateway.routing.adaptive.overrides.handover import HandoverKnobs
from gateway.routing.adaptive.overrides.probe import ProbeKnobs
from gateway.routing.adaptive.overrides.quiet import QuietKnobs
from gateway.routing.adaptive.shared import SharedKnobs
from gateway.routing.adaptive.stepscale import StepScaleKnobs, StepScales

DOC = Path(__file__).resolve().parents[3] / "docs" / "routing-core.md"

# (part, knobs class), in the pipeline's order
KNOBS: list[tuple[str, type]] = [
    ("estimate", EstimateKnobs),
    ("estimate: live corrections", LiveKnobs),
    ("estimate: step scales", StepScaleKnobs),
    ("estimate: latency bias", CalibrationKnobs),
    ("estimate: load log", LoadLogKnobs),
    ("estimate: context", ContextKnobs),
    ("estimate: traffic mix", MixKnobs),
    ("regime controller", ControllerKnobs),
    ("regime: exploration", ExploreKnobs),
    ("cluster", ClusterKnobs),
    ("cluster: shared pair", SharedKnobs),
    ("override: quiet pair", QuietKnobs),
    ("override: handover", HandoverKnobs),
    ("override: probe", ProbeKnobs),
]
# stateful parts whose constructor takes documented knobs too
STATEFUL: list[tuple[str, type]] = [
    ("estimate: step scales", StepScales),
    ("estimate: latency bias", LatencyBias),
]


def rows() -> list[str]:
    out = []
    for part, cls in [*KNOBS, *STATEFUL]:
        for name, default, unit, why in knob_rows(cls):
            if not why:
                continue  # a stateful part's state, not a knob
            value = f"{default:.4g}" if isinstance(default, float) else str(default)
            out.append(f"| {part} | `{cls.__name__}.{name}` | {value} | {unit} | {why} |")
    return out


def table() -> str:
    head = ["| part | knob | default | unit | why this default |", "|---|---|---|---|---|"]
    return "\n".join([*head, *rows()])


@pytest.mark.parametrize(("part", "cls"), KNOBS)
def test_knobs_are_frozen_and_each_has_a_unit_and_a_reason(part: str, cls: type) -> None:
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
    for name, _, unit, why in knob_rows(cls):
        assert unit and why, f"{cls.__name__}.{name} needs knob(default, unit, why)"


def test_the_doc_lists_every_knob_as_the_code_has_it() -> None:
    doc = DOC.read_text(encoding="utf-8")
    missing = [r for r in rows() if r not in doc]
    assert not missing, "regenerate the table (python -m tests.routing.adaptive.test_knobs):\n" + "\n".join(
        missing
    )


if __name__ == "__main__":
    print(table())
