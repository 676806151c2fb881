"""One vocabulary of speculative methods: every layer classifies a method the same way."""

from __future__ import annotations

import pytest

from gateway.config.models import EngineConfig
from gateway.physics import get_profile
from gateway.physics.methods import (
    DRAFT_MODEL,
    HEAD_METHODS,
    METHODS,
    MODEL_METHODS,
    NGRAM_METHODS,
    ONE_PASS_METHODS,
    PROMPT_LOOKUP_METHODS,
)
from gateway.routing.acceptance import prior_tokens_per_step
from gateway.routing.steptime import TableStepModel
from specgate_lab.emulator.spec import parse_spec_config


def test_every_vllm_method_is_exactly_one_kind() -> None:
    kinds = [NGRAM_METHODS, frozenset({DRAFT_MODEL}), HEAD_METHODS, ONE_PASS_METHODS]
    for m in METHODS:
        assert sum(m in kind for kind in kinds) == 1, m
    assert set(METHODS) == (NGRAM_METHODS - {"prompt_lookup"}) | MODEL_METHODS
    assert PROMPT_LOOKUP_METHODS <= NGRAM_METHODS


def test_config_and_emulator_accept_exactly_the_vocabulary() -> None:
    for m in METHODS:
        assert EngineConfig(name="e", url="http://h:1", served_model_name="x", method=m, k=2).method == m
        spec = parse_spec_config({"method": m, "num_speculative_tokens": 2, "model": "d"})
        assert spec is not None and spec.method == m
        assert spec.text_based == (m in NGRAM_METHODS)
    with pytest.raises(ValueError):
        EngineConfig.model_validate(
            {"name": "e", "url": "http://h:1", "served_model_name": "x", "method": "prompt_lookup", "k": 2}
        )


@pytest.mark.parametrize("method", sorted(NGRAM_METHODS))
def test_ngram_methods_cost_host_time_only_and_share_the_ngram_prior(method: str) -> None:
    prof = get_profile("h200-qwen3-8b")
    assert prof.draft_ms(method, 5, 8) == prof.draft_ms("ngram", 5, 8)
    table = TableStepModel()
    assert table.spec_extra_ms(method, 5, 8) == table.spec_extra_ms("ngram", 5, 8)
    assert prior_tokens_per_step(method, 0.6, 0.0, 5) == prior_tokens_per_step("ngram", 0.6, 0.0, 5)


@pytest.mark.parametrize("method", sorted(MODEL_METHODS))
def test_model_methods_cost_gpu_drafting(method: str) -> None:
    prof = get_profile("h200-qwen3-8b")
    assert prof.draft_ms(method, 5, 8) > prof.draft_ms("ngram", 5, 8)
    table = TableStepModel()
    assert table.spec_extra_ms(method, 5, 8) > table.spec_extra_ms("ngram", 5, 8)
