"""One request pipeline: the gateway and the simulator get the same features and outcomes."""

from __future__ import annotations

import json
import random

import pytest

from gateway.api.features import parse_json
from gateway.api.features import parse_request as gateway_parse
from gateway.api.learning import lookup_settings
from gateway.config import load_config
from gateway.config.models import ModelConfig
from gateway.engines.runtime import ModelRuntime
from gateway.pipeline.outcome import Answer, LookupSettings, build_outcome
from gateway.pipeline.request import CHAT
from gateway.routing.adaptive import LOOKUP_DRAFTS_KEY
from gateway.routing.static import FixedPolicy
from gateway.routing.types import Route
from specgate_lab.sim.run import MODEL, parse_workload
from specgate_lab.workload import sample, to_openai_body


@pytest.mark.parametrize("mix", ["edit=1", "summary=1", "rag=1", "chat=1"])
def test_gateway_and_simulator_extract_equal_features(mix: str) -> None:
    rng = random.Random(11)
    for _ in range(5):
        wr = sample(rng, mix, "uniform:0:1")
        raw = json.dumps(to_openai_body(wr, MODEL)).encode()  # the bytes a client would send
        gw = gateway_parse(parse_json(raw), CHAT, None, allow_override=True)
        sim = parse_workload(wr)
        assert sim.features == gw.features
        assert sim.prompt_text == gw.prompt_text == wr.prompt_text
        assert sim.features.prompt_tokens > 0 and sim.features.stream


def test_outcome_from_an_answer() -> None:
    feats = parse_workload(sample(random.Random(3), "edit=1", "0")).features
    ans = Answer(Route.SPEC, "spec0", True, 10.0, 10.2, 11.2, 101, prompt_tokens=400, steps=40, retried=True)
    out = build_outcome(feats, ans, probe=True, lookup=(0.5, 2.5), predicted_tpot_s=0.008)
    assert out.ttft_s == pytest.approx(0.2) and out.tpot_s == pytest.approx(0.01)
    assert out.predicted_tpot_s == 0.008  # the decision's prediction goes back to the policy
    assert (out.prompt_tokens, out.completion_tokens, out.steps, out.probe) == (400, 101, 40, True)
    assert out.lookup_acceptance == 0.5 and out.extra == {"retried": 1.0, LOOKUP_DRAFTS_KEY: 2.5}
    assert (out.kind, out.temperature, out.model) == (feats.kind, 0.0, MODEL)
    unknown = build_outcome(feats, Answer(Route.BASE, "base0", True, 0.0, None, None, 0), probe=False)
    assert unknown.prompt_tokens == feats.prompt_tokens and unknown.steps is None and unknown.tpot_s is None
    assert unknown.predicted_tpot_s is None


def test_lookup_replay_uses_the_serving_pairs_settings() -> None:
    base = load_config(None, env={}).models[0].model_dump()
    second = json.loads(json.dumps(base["pairs"][0]))
    second["device"] = "gpu1"
    second["spec"].update(
        name="spec1", url="http://127.0.0.1:8201", k=3, prompt_lookup_min=4, prompt_lookup_max=6
    )
    second["base"].update(name="base1", url="http://127.0.0.1:8202")
    cfg = ModelConfig.model_validate({**base, "pairs": [base["pairs"][0], second]})
    mrt = ModelRuntime.from_config(cfg, FixedPolicy(Route.SPEC))
    assert lookup_settings(mrt, "spec0") == LookupSettings(5, 2, 5)
    assert lookup_settings(mrt, "spec1") == LookupSettings(3, 4, 6)
    assert lookup_settings(mrt, "base1") == LookupSettings(3, 4, 6)  # the pair, not the engine
