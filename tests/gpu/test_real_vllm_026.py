"""The same contract against REAL vLLM 0.26.0 (round 2 of the real-GPU run).

Pages and probe from one H200: a plain engine, n-gram, EAGLE-3 with synthetic acceptance
(rates 0.4/0.15/0.05) on vLLM's default V2 model runner and on the V1 runner, and the same
EAGLE-3 with Dynamic SD (``num_speculative_tokens_per_batch_size``, K=0 above batch 32).
The pages are the engines' totals after the run's windows, so acceptance per position is
checked from one page: accepted at a position ÷ drafts. No GPU is needed to run these tests.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.engines.parse import parse_metrics
from gateway.proxy.sse import Harvest
from tests.gpu.test_real_vllm_contract import assert_gateway_families

FIX = Path(__file__).resolve().parent / "fixtures" / "vllm-0.26.0"
RATES = (0.4, 0.15, 0.05)
SPEC_ENGINES = {"ngram": 5, "eagle3-lo": 3, "eagle3-lo-v1": 3, "eagle3-dsd": 3}


def page(engine: str) -> str:
    return (FIX / f"final-{engine}.txt").read_text()


def probe() -> dict[str, dict[str, dict[str, object]]]:
    data: dict[str, dict[str, dict[str, object]]] = json.loads((FIX / "probe.json").read_text())
    return data


@pytest.mark.parametrize("engine", ["base", *SPEC_ENGINES])
def test_every_family_the_gateway_reads_is_still_on_the_page(engine: str) -> None:
    assert_gateway_families(page(engine), speculative=engine != "base")


@pytest.mark.parametrize("engine", list(SPEC_ENGINES))
def test_parser_reads_0_26_pages(engine: str) -> None:
    s = parse_metrics(page(engine), f"qwen3-8b-{engine}")
    assert s.has_vllm_metrics and s.has_spec_metrics
    assert s.generation_tokens is not None and s.generation_tokens > 0
    assert s.per_position is not None and len(s.per_position) == SPEC_ENGINES[engine]
    assert s.accepted is not None and sum(s.per_position) == pytest.approx(s.accepted)
    assert parse_metrics(page(engine), "some-other-model").generation_tokens is None


@pytest.mark.parametrize("engine", ["eagle3-lo", "eagle3-lo-v1", "eagle3-dsd"])
def test_acceptance_per_position_is_the_configured_rates_on_either_runner_and_with_dynamic_sd(
    engine: str,
) -> None:
    """Dynamic SD's K=0 steps draft nothing and count no draft: the steps that do draft
    still accept at the configured rates, so the gateway's windowed acceptance reads the
    drafter right; what K=0 changes shows in tokens per step, not in acceptance."""
    s = parse_metrics(page(engine), f"qwen3-8b-{engine}")
    assert s.drafts and s.per_position is not None
    assert [a / s.drafts for a in s.per_position] == pytest.approx(RATES, abs=0.03)


def test_dynamic_sd_drafts_fewer_tokens_per_generated_token() -> None:
    """The same drafter and traffic: with K=0 above batch 32 a share of the generated
    tokens came from steps that drafted nothing."""

    def drafts_per_token(engine: str) -> float:
        s = parse_metrics(page(engine), f"qwen3-8b-{engine}")
        assert s.draft_tokens is not None and s.generation_tokens
        return s.draft_tokens / s.generation_tokens

    assert drafts_per_token("eagle3-dsd") < 0.97 * drafts_per_token("eagle3-lo")


@pytest.mark.parametrize("engine", ["ngram", "eagle3-lo", "eagle3-dsd"])
def test_refused_parameters_unchanged(engine: str) -> None:
    p = probe()[engine]
    r = p["refused_logit_bias"]
    assert r["status"] == 400
    err = json.loads(str(r["body"]))["error"]
    assert err["type"] == "BadRequestError" and "logit_bias" in err["message"]
    events = [
        ln[6:] for ln in str(p["refused_logit_bias_stream"]["body"]).splitlines() if ln.startswith("data: ")
    ]
    assert events[-1] == "[DONE]" and len(events) == 2
    h = Harvest()
    h.take(json.loads(events[0]))
    assert h.error == "engine_error"
    assert p["refused_min_p"]["status"] == 200  # greedy: vLLM resets min_p, as on 0.20.2


def test_emulator_accepts_the_dynamic_sd_config_vllm_0_26_started_with() -> None:
    from specgate_lab.emulator.spec import parse_spec_config

    cfg = {**probe()["eagle3-dsd"]["spec"], "model": "/models/draft"}
    sc = parse_spec_config(cfg)
    assert sc.k == 3 and sc.k_per_batch == ((1, 32, 3), (33, 1024, 0))
