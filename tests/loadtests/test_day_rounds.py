"""A compressed day in rounds: each round rotates the slot order, a policy named twice
runs as an A/A, and the rounds combine into ratios with their spread."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.deploy.helpers import load_module

GPU = Path(__file__).resolve().parents[2] / "loadtests" / "gpu"


@pytest.fixture(scope="module")
def rounds() -> ModuleType:
    return load_module(GPU / "day_rounds.py", "specgate_day_rounds")


def test_rounds_rotate_the_order_and_name_a_repeated_policy_apart() -> None:
    import sys

    sys.path.insert(0, str(GPU))
    day = load_module(GPU / "day.py", "specgate_day")
    slots = ["adaptive", "always-spec", "always-base", "adaptive"]
    assert day.slot_order(slots, 0) == ["adaptive", "always-spec", "always-base", "adaptive#2"]
    assert day.slot_order(slots, 1) == ["always-spec", "always-base", "adaptive#2", "adaptive"]
    assert day.slot_order(slots, 5) == day.slot_order(slots, 1)
    assert [day.base_name(s) for s in day.slot_order(slots, 2)] == [
        "always-base",
        "adaptive",
        "adaptive",
        "always-spec",
    ]


def _day(folder: Path, round_: int, order: list[str], tpot: dict[str, float]) -> Path:
    folder.mkdir()
    rows = [{"policy": p, "mean_tpot_ms": v} for p, v in tpot.items()] + [
        {"policy": "oracle", "mean_tpot_ms": 1.0}
    ]
    (folder / "results.json").write_text(
        json.dumps({"rows": rows, "meta": {"round": round_, "order": order}})
    )
    return folder


def test_rounds_combine_into_ratios_with_their_spread(rounds: ModuleType, tmp_path: Path) -> None:
    a = _day(tmp_path / "r0", 0, ["adaptive", "always-spec"], {"adaptive": 9.0, "always-spec": 8.0})
    b = _day(tmp_path / "r1", 1, ["always-spec", "adaptive"], {"adaptive": 8.0, "always-spec": 8.0})
    days = [rounds.load(a), rounds.load(b)]
    c = rounds.combine(days)["adaptive ÷ always-spec"]
    assert c["rounds"] == 2 and c["min"] == pytest.approx(1.0) and c["max"] == pytest.approx(1.125)
    assert c["mean"] == pytest.approx((1.125 * 1.0) ** 0.5)
    assert "adaptive ÷ always-base" not in rounds.combine(days)  # never ran
    md = rounds.markdown(days)
    assert "| 1 | always-spec, adaptive |" in md and "[1.000, 1.125]" in md


def test_rounds_unequal_per_order_are_balanced_and_any_repeated_policy_is_an_a_a(
    rounds: ModuleType, tmp_path: Path
) -> None:
    first = ["adaptive", "always-base"]
    later = ["always-base", "adaptive"]
    days = [
        rounds.load(_day(tmp_path / "r0", 0, first, {"adaptive": 10.0, "always-base": 8.0})),
        rounds.load(_day(tmp_path / "r1", 1, later, {"adaptive": 8.0, "always-base": 10.0})),
        rounds.load(_day(tmp_path / "r3", 3, later, {"adaptive": 8.0, "always-base": 10.0})),
        rounds.load(
            _day(
                tmp_path / "aa",
                0,
                ["always-base", "always-base#2"],
                {"always-base": 10.0, "always-base#2": 9.0},
            )
        ),
    ]
    c = rounds.combine(days)
    base = c["adaptive ÷ always-base"]
    assert (
        base["rounds"] == 3 and base["first"] == pytest.approx(1.25) and base["later"] == pytest.approx(0.8)
    )
    assert base["balanced"] == pytest.approx(1.0)  # two rounds of one order do not outvote one of the other
    assert base["mean"] == pytest.approx((1.25 * 0.8 * 0.8) ** (1 / 3))
    aa = c["A/A: always-base#2 ÷ always-base"]
    assert aa["rounds"] == 1 and aa["mean"] == pytest.approx(0.9) and "balanced" not in aa
    md = rounds.markdown(days)
    assert "balanced 1.000" in md and "| A/A: always-base#2 ÷ always-base |" in md


def test_the_t_interval_over_rounds_widens_with_their_spread_and_needs_two(rounds: ModuleType) -> None:
    assert rounds.t_interval([0.95]) is None
    lo, hi = rounds.t_interval([0.964, 0.954, 0.939])
    assert lo < 0.939 and hi > 0.964  # wider than the range of three rounds
    assert lo == pytest.approx(0.9213, abs=1e-3) and hi == pytest.approx(0.9846, abs=1e-3)
    tight = rounds.t_interval([0.95, 0.951, 0.949])
    assert tight[1] - tight[0] < hi - lo
    same = rounds.t_interval([0.9, 0.9])
    assert same == pytest.approx((0.9, 0.9))


def test_twin_requests_are_compared_by_the_route_adaptive_gave_them(
    rounds: ModuleType, tmp_path: Path
) -> None:
    import gzip

    folder = _day(tmp_path / "r0", 0, ["adaptive", "always-base"], {"adaptive": 8.0, "always-base": 9.0})
    doc = json.loads((folder / "results.json").read_text())
    (folder / "results.json").write_text(json.dumps({**doc, "t0": 5.0}))
    lines = ["policy,arrival,route,reason,output_tokens,ttft_s,tpot_s,finished_at"]
    for arrival, route, a, b in [
        ("1.0", "spec", 0.001, 0.009),  # before t0: not counted
        ("6.0", "spec", 0.008, 0.010),
        ("7.0", "spec", 0.008, 0.010),
        ("8.0", "base", 0.011, 0.010),
        ("9.0", "base", "", 0.010),  # unfinished in adaptive's slot: no twin
    ]:
        lines.append(f"adaptive,{arrival},{route},r,4,0.1,{a},1")
        lines.append(f"always-base,{arrival},base,pinned,4,0.1,{b},1")
    with gzip.open(folder / "requests.csv.gz", "wt") as fh:
        fh.write("\n".join(lines) + "\n")
    day = rounds.load(folder)
    tw = rounds.twins(day)
    assert tw["spec"] == (2, pytest.approx(0.8)) and tw["base"] == (1, pytest.approx(1.1))
    assert "on base 1.100 (1), on spec 0.800 (2)" in rounds.markdown([day])
    assert rounds.twins(rounds.load(_day(tmp_path / "r1", 1, [], {"adaptive": 1.0}))) == {}  # no csv
