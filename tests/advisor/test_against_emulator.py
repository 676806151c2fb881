"""The advisor's replay of a plain engine's answers against what the emulated speculative
engine then counts for the same requests (its per-request speculative counters), for
vLLM's n-gram and suffix-decoding methods, greedy and sampled (seeded: both engines write
the same text). The same proposer rules over the same text: within a few per cent."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from gateway.advisor.replay import replay
from gateway.advisor.report import Advice
from gateway.pipeline.outcome import LookupSettings
from gateway.text.suffix import SuffixSettings
from specgate_lab.emulator.launch import pair_launches, start_group
from specgate_lab.workload.sampler import iter_requests, to_openai_body

pytestmark = pytest.mark.timeout(120)

SUFFIX = SuffixSettings(k=16, max_cached_requests=64)


async def _answer(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
        got: dict[str, Any] = await r.json()
        return got


@pytest.mark.parametrize(
    ("method", "temperature"),
    [("ngram", "0"), ("ngram", "choice:0.3,0.7,1.0"), ("suffix", "0"), ("suffix", "0.7")],
)
async def test_predicted_acceptance_matches_the_emulated_engine(method: str, temperature: str) -> None:
    config = {"method": method, "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    if method == "suffix":
        config = {
            "method": "suffix",
            "num_speculative_tokens": SUFFIX.k,
            "suffix_decoding_max_cached_requests": 64,
        }
    group = await start_group(
        pair_launches(
            port_spec=0, port_base=0, per_request_metrics=True, speculative_config=json.dumps(config)
        ),
        time_scale=0.05,
    )
    spec, base = group.engines
    reqs = [
        r
        for r in iter_requests(5, 40, mix="edit=0.6,summary=0.2,chat=0.2", temperature=temperature)
        if r.max_tokens
    ]
    adv = Advice(LookupSettings(k=5, n_min=2, n_max=5), SUFFIX if method == "suffix" else None)
    suffix = None if adv.answers is None else (SUFFIX, adv.answers)
    accepted = drafted = 0
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
            for r in reqs[:24]:
                plain = await _answer(
                    s, base.url, to_openai_body(r, base.handle.name, stream=False, seeded=True)
                )
                text = plain["choices"][0]["message"]["content"]
                stopped = plain["choices"][0]["finish_reason"] == "stop"
                body = to_openai_body(r, "m", stream=False)
                adv.add(replay(body, text, adv.settings, stopped=stopped, suffix=suffix))
                sp = await _answer(
                    s, spec.url, to_openai_body(r, spec.handle.name, stream=False, seeded=True)
                )
                assert sp["choices"][0]["message"]["content"] == text  # seeded: the same answer
                m = sp["metrics"]["speculative_decoding"]
                accepted += m["num_accepted_draft_tokens"]
                drafted += m["num_draft_tokens"]
    finally:
        await group.stop()
    proposer = adv.suffix_advice if method == "suffix" else adv.ngram
    assert proposer is not None
    predicted = proposer.total.acceptance_rate
    assert predicted is not None and drafted > 100
    assert predicted == pytest.approx(accepted / drafted, rel=0.10)
