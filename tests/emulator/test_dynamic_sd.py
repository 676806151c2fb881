"""Dynamic SD (``num_speculative_tokens_per_batch_size``): K chosen by batch size, K=0 charged."""

from __future__ import annotations

import json

import pytest

from specgate_lab.emulator.device import Device
from specgate_lab.emulator.engine import Engine, EngineConfig
from specgate_lab.emulator.spec import SpecConfigError, k0_overhead, parse_spec_config
from tests.emulator.conftest import run_all, run_sequential
from tests.emulator.prompts import EDITS


def _cfg(per_batch: object, k: int = 5) -> str:
    return json.dumps(
        {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": 2,
            "prompt_lookup_max": 5,
            "num_speculative_tokens_per_batch_size": per_batch,
        }
    )


def test_k_follows_the_covering_range_carries_over_gaps_and_is_capped() -> None:
    c = parse_spec_config(_cfg([[5, 8, 2], [1, 2, 9], [20, 1000, 0]]))
    assert c is not None and c.k_per_batch == ((1, 2, 9), (5, 8, 2), (20, 1000, 0))
    # 1-2 ask for 9 but K is capped at num_speculative_tokens; 3-4 (a gap) carry K forward
    assert [c.k_at(b) for b in (1, 2, 3, 4, 5, 8, 19, 20, 5000)] == [5, 5, 5, 5, 2, 2, 2, 0, 0]
    assert c.as_dict()["num_speculative_tokens_per_batch_size"] == [[1, 2, 9], [5, 8, 2], [20, 1000, 0]]
    plain = parse_spec_config(_cfg(None))
    assert plain is not None and plain.k_per_batch == () and plain.k_at(10_000) == 5


@pytest.mark.parametrize(
    "per_batch,err",
    [
        ([], "non-empty"),
        ({"1": 5}, "non-empty"),
        ([[1, 4]], r"\[start, end, K\]"),
        ([[1, 4, True]], r"\[start, end, K\]"),
        ([[1, 4, 2.5]], r"\[start, end, K\]"),
        ([[1, 4, -1]], ">= 0"),
        ([[0, 4, 2]], "positive"),
        ([[5, 4, 2]], "start <= end"),
        ([[1, 4, 2], [4, 9, 0]], "overlap"),
        ([[2, 4, 2]], "start at 1"),
    ],
)
def test_bad_per_batch_configs_are_refused_with_the_reason(per_batch: object, err: str) -> None:
    with pytest.raises(SpecConfigError, match=err):
        parse_spec_config(_cfg(per_batch))


def test_k0_overhead_interpolates_the_measured_points_in_log_batch() -> None:
    assert k0_overhead(1) == pytest.approx(0.066)
    assert k0_overhead(2) == pytest.approx(0.066)
    assert k0_overhead(189) == pytest.approx(0.216)
    assert k0_overhead(4096) == pytest.approx(0.216)
    mid = k0_overhead(round((2 * 189) ** 0.5))  # geometric middle: about halfway
    assert 0.13 < mid < 0.15
    assert k0_overhead(8) < k0_overhead(32) < k0_overhead(128)


def _steps(spec: str | None, concurrent: int) -> tuple[Engine, float]:
    """``concurrent`` copy-heavy T=0 edits started together; the engine and its busy time."""
    dev = Device()
    eng = dev.attach(Engine(EngineConfig("m", spec=parse_spec_config(spec) if spec else None)))
    prompts = [EDITS[i % len(EDITS)] for i in range(concurrent)]
    reqs = [eng.make_request(p, max_tokens=120, temperature=0.0) for p in prompts]
    if concurrent == 1:
        return eng, run_sequential(dev, eng, reqs)
    for r in reqs:
        dev.submit(eng, r, 0.0)
    run_all(dev)
    return eng, dev.t


def test_a_batch_above_the_threshold_runs_k0_and_pays_the_overhead_over_plain() -> None:
    dyn = _cfg([[1, 2, 5], [3, 4096, 0]])
    eng_dyn, t_dyn = _steps(dyn, 6)
    eng_plain, t_plain = _steps(None, 6)
    # K=0 at six requests: nothing drafted, the same tokens in the same number of steps...
    assert eng_dyn.stats.num_drafts == 0
    assert eng_dyn.stats.generation_tokens == eng_plain.stats.generation_tokens
    # ...each step dearer than plain by the overhead measured at that batch (6 down to 3 as
    # requests finish, so between the overheads of those sizes)
    ratio = t_dyn / t_plain
    assert 1 + k0_overhead(2) < ratio < 1 + k0_overhead(7)


def test_a_batch_within_the_threshold_speculates_as_the_fixed_k_engine() -> None:
    dyn = _cfg([[1, 2, 5], [3, 4096, 0]])
    eng_dyn, t_dyn = _steps(dyn, 1)
    eng_fixed, t_fixed = _steps(_cfg(None), 1)
    assert eng_dyn.stats.num_drafts == eng_fixed.stats.num_drafts > 0
    assert eng_dyn.stats.num_accepted == eng_fixed.stats.num_accepted
    assert t_dyn == pytest.approx(t_fixed)
