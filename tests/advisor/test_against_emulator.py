"""The advisor's replay of a plain engine's greedy answers against what the emulated
n-gram engine then counts for the same requests (its per-request speculative counters):
the same proposer rules over the same text, so within a few per cent."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from gateway.advisor.replay import replay
from gateway.advisor.report import Advice
from gateway.emulator.launch import pair_launches, start_group
from gateway.pipeline.outcome import LookupSettings
from gateway.workload.sampler import iter_requests, to_openai_body

pytestmark = pytest.mark.timeout(120)


async def _answer(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with session.post(url + "/v1/chat/completions", json=body) as r:
        assert r.status == 200
        got: dict[str, Any] = await r.json()
        return got


async def test_predicted_acceptance_matches_the_emulated_ngram_engine() -> None:
    group = await start_group(
        pair_launches(port_spec=0, port_base=0, per_request_metrics=True), time_scale=0.05
    )
    spec, base = group.engines
    reqs = [
        r for r in iter_requests(5, 40, mix="edit=0.6,summary=0.2,chat=0.2", temperature=0.0) if r.max_tokens
    ]
    adv = Advice(LookupSettings(k=5, n_min=2, n_max=5))
    accepted = drafted = 0
    try:
        async with aiohttp.ClientSession() as s:
            for r in reqs[:24]:
                plain = await _answer(
                    s, base.url, to_openai_body(r, base.handle.name, stream=False, seeded=True)
                )
                text = plain["choices"][0]["message"]["content"]
                stopped = plain["choices"][0]["finish_reason"] == "stop"
                adv.add(replay(to_openai_body(r, "m", stream=False), text, adv.settings, stopped=stopped))
                sp = await _answer(
                    s, spec.url, to_openai_body(r, spec.handle.name, stream=False, seeded=True)
                )
                assert sp["choices"][0]["message"]["content"] == text  # greedy: the same answer
                m = sp["metrics"]["speculative_decoding"]
                accepted += m["num_accepted_draft_tokens"]
                drafted += m["num_draft_tokens"]
    finally:
        await group.stop()
    predicted = adv.total.acceptance_rate
    assert predicted is not None and drafted > 100
    assert predicted == pytest.approx(accepted / drafted, rel=0.10)
