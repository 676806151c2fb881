"""Header hygiene, request ids, body pass-through, telemetry hooks and learning."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field

import aiohttp
import pytest

from gateway.routing.adaptive import LOOKUP_DRAFTS_KEY
from gateway.routing.overlap import realised_lookup_rates
from gateway.routing.static import FixedPolicy
from gateway.routing.types import Decision, ModelView, Outcome, RequestFeatures, Route
from tests.proxy.fake_engine import FakeEngine
from tests.proxy.harness import harness

REQ = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.9}


async def test_hop_by_hop_and_credentials_are_not_forwarded() -> None:
    # x-custom and x-hop are allowed by server.forward_headers; x-hop is still dropped
    # because the client's Connection header lists it.
    async with harness(server={"forward_headers": ["x-custom", "x-hop"]}) as h, aiohttp.ClientSession() as s:
        headers = {
            "Authorization": "Bearer client-secret",
            "Connection": "keep-alive, X-Hop",
            "X-Hop": "drop me",
            "Keep-Alive": "timeout=5",
            "Proxy-Authorization": "Basic abc",
            "TE": "trailers",
            "Upgrade": "h2c",
            "X-Custom": "keep me",
            "x-specgate-engine": "spoofed",
        }
        async with s.post(h.url("/v1/chat/completions"), json=REQ, headers=headers) as r:
            assert r.status == 200
    seen = {k.lower(): v for k, v in h.base.requests[0].headers.items()}
    assert seen.get("x-custom") == "keep me"
    for gone in (
        "authorization",
        "x-hop",
        "keep-alive",
        "proxy-authorization",
        "te",
        "upgrade",
        "x-specgate-engine",
    ):
        assert gone not in seen, gone


async def test_engine_api_key_is_sent_upstream() -> None:
    async with harness() as h:
        # patch the engine config after build: the key lives in EngineConfig.api_key
        from pydantic import SecretStr

        from gateway.api.state import STATE

        h.app[STATE].models["m1"].engines["base0"].config.api_key = SecretStr("engine-key-123")
        async with aiohttp.ClientSession() as s, s.post(h.url("/v1/chat/completions"), json=REQ) as r:
            assert r.status == 200
    assert h.base.requests[0].headers["Authorization"] == "Bearer engine-key-123"


async def test_request_id_is_kept_when_safe_and_replaced_when_not() -> None:
    async with harness() as h, aiohttp.ClientSession() as s:
        async with s.post(
            h.url("/v1/chat/completions"), json=REQ, headers={"x-request-id": "abc-123.x:y"}
        ) as r:
            assert r.headers["x-request-id"] == "abc-123.x:y"
        async with s.post(
            h.url("/v1/chat/completions"),
            json=REQ,
            headers={"x-request-id": "bad id\twith<junk>" + "x" * 200},
        ) as r:
            new_id = r.headers["x-request-id"]
            assert len(new_id) == 32 and new_id.isalnum()
        async with s.post(h.url("/v1/chat/completions"), json=REQ) as r:
            assert len(r.headers["x-request-id"]) == 32
    assert h.base.requests[0].headers["x-request-id"] == "abc-123.x:y"
    assert h.base.requests[1].headers["x-request-id"] == new_id


async def test_unknown_fields_pass_through_untouched() -> None:
    extra = {"guided_json": {"type": "object"}, "foo": [1, {"bar": None}], "top_k": 5}
    async with (
        harness() as h,
        aiohttp.ClientSession() as s,
        s.post(h.url("/v1/chat/completions"), json={**REQ, **extra}) as r,
    ):
        body = await r.json()
    sent = h.base.requests[0].body
    for k, v in extra.items():
        assert sent[k] == v
    assert sent["messages"] == REQ["messages"]
    assert body["model"] == "m1"
    assert body["choices"][0]["message"]["content"] == "Hello, world!"


@dataclass
class RecordingRequest:
    calls: list[str] = field(default_factory=list)
    finished_with: list[tuple[int, str | None]] = field(default_factory=list)

    def decided(self, features: RequestFeatures, decision: Decision, decision_seconds: float) -> None:
        self.calls.append(f"decided:{decision.route.value}")

    def upstream_started(self, engine: str, attempt: int) -> Mapping[str, str]:
        self.calls.append(f"started:{engine}:{attempt}")
        return {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}

    def upstream_first_byte(self, engine: str) -> None:
        self.calls.append(f"first_byte:{engine}")

    def upstream_failed(self, engine: str, error: str, retried: bool) -> None:
        self.calls.append(f"failed:{engine}:{error}:{retried}")

    def first_token(self) -> None:
        self.calls.append("first_token")

    def finished(
        self,
        status: int,
        *,
        prompt_tokens: int | None = None,
        completion_tokens: int | None = None,
        error: str | None = None,
    ) -> None:
        self.calls.append("finished")
        self.finished_with.append((status, error))


@dataclass
class RecordingTelemetry:
    requests: list[RecordingRequest] = field(default_factory=list)

    def start_request(
        self, model: str, endpoint: str, request_id: str, headers: Mapping[str, str]
    ) -> RecordingRequest:
        r = RecordingRequest()
        self.requests.append(r)
        return r


async def test_telemetry_hooks_in_order_and_finished_exactly_once() -> None:
    tel = RecordingTelemetry()
    spec = FakeEngine("m1-spec", status=502)
    async with harness(spec=spec, telemetry=tel) as h, aiohttp.ClientSession() as s:
        body = {**REQ, "temperature": 0.0, "stream": True}
        async with s.post(h.url("/v1/chat/completions"), json=body) as r:
            await r.read()
        async with s.post(h.url("/v1/chat/completions"), data=b"{nope") as r:
            assert r.status == 400
    first, second = tel.requests
    assert first.calls == [
        "decided:spec",
        "started:spec0:0",
        "failed:spec0:status_5xx:True",
        "started:base0:1",
        "first_byte:base0",
        "first_token",
        "finished",
    ]
    assert first.finished_with == [(200, None)]
    assert second.calls == ["finished"] and second.finished_with == [(400, "invalid_json")]
    assert h.base.requests[0].headers["traceparent"].startswith("00-0af7")


@dataclass
class RecordingPolicy:
    inner: FixedPolicy = field(default_factory=lambda: FixedPolicy(Route.SPEC))
    name: str = "recording"
    outcomes: list[Outcome] = field(default_factory=list)
    seen: asyncio.Event = field(default_factory=asyncio.Event)

    def decide(self, features: RequestFeatures, view: ModelView, now: float) -> Decision:
        return self.inner.decide(features, view, now)

    def observe(self, outcome: Outcome, now: float) -> None:
        self.outcomes.append(outcome)
        self.seen.set()

    def snapshot(self) -> dict[str, object]:
        return {"outcomes": len(self.outcomes)}


async def test_policy_observes_outcome_with_lookup_and_reported_acceptance() -> None:
    policy = RecordingPolicy()
    prompt = "Return this unchanged: the quick brown fox jumps over the lazy dog"
    spec = FakeEngine(
        "m1-spec",
        tokens=["the", " quick", " brown", " fox", " jumps", " over", " the", " lazy", " dog"],
        spec_metrics={"mean_acceptance_length": 4.2, "draft_acceptance_rate": 0.66},
    )
    async with harness(spec=spec, policies={"m1": policy}) as h, aiohttp.ClientSession() as s:
        body = {"model": "m1", "messages": [{"role": "user", "content": prompt}], "stream": True}
        async with s.post(h.url("/v1/chat/completions"), json=body) as r:
            await r.read()
        await asyncio.wait_for(policy.seen.wait(), 5)
    (o,) = policy.outcomes
    assert o.route is Route.SPEC and o.engine == "spec0" and o.ok
    assert o.completion_tokens == 9 and o.prompt_tokens == 7
    assert o.reported_mean_acceptance_length == 4.2 and o.reported_acceptance_rate == 0.66
    # Replayed with the spec engine's declared n-gram sizes (ngram defaults: 2..5).
    expected = realised_lookup_rates(prompt, "".join(spec.tokens), k=5, n_min=2, n_max=5)
    assert expected is not None and expected[0] > 0
    assert o.lookup_acceptance == expected[0]
    assert o.extra[LOOKUP_DRAFTS_KEY] == expected[1]
    assert o.ttft_s is not None and o.ttft_s >= 0
    assert o.tpot_s is not None and o.tpot_s >= 0


async def test_a_failing_policy_observe_never_fails_the_request() -> None:
    class Broken(RecordingPolicy):
        def observe(self, outcome: Outcome, now: float) -> None:
            raise RuntimeError("boom")

    async with (
        harness(policies={"m1": Broken()}) as h,
        aiohttp.ClientSession() as s,
        s.post(h.url("/v1/chat/completions"), json=REQ) as r,
    ):
        assert r.status == 200
        assert (await r.json())["model"] == "m1"


async def test_a_failing_policy_decide_falls_back_to_the_plain_engine() -> None:
    class Broken(RecordingPolicy):
        def decide(self, features: RequestFeatures, view: ModelView, now: float) -> Decision:
            raise ZeroDivisionError

    async with (
        harness(policies={"m1": Broken()}) as h,
        aiohttp.ClientSession() as s,
        s.post(h.url("/v1/chat/completions"), json=REQ) as r,
    ):
        assert r.status == 200
        assert r.headers["x-specgate-route"] == "base"
        assert r.headers["x-specgate-reason"] == "policy_error"
    assert json.loads(json.dumps(h.base.requests[0].body))["model"] == "m1-base"


def test_lookup_sample_budget_bounds_learning_cpu() -> None:
    from gateway.api.learning import SampleBudget

    b = SampleBudget(rate=2.0, burst=2.0)
    b.last = 0.0
    assert [b.take(0.0), b.take(0.0), b.take(0.0)] == [True, True, False]
    assert b.take(0.5) is True and b.take(0.5) is False
    assert b.take(100.0) and b.take(100.0) and not b.take(100.0)  # refills only up to the burst


async def test_outcome_observed_without_lookup_when_budget_is_spent() -> None:
    from gateway.api.state import STATE

    policy = RecordingPolicy()
    async with harness(policies={"m1": policy}) as h, aiohttp.ClientSession() as s:
        budget = h.app[STATE].lookup_budget("m1")
        budget.rate, budget.tokens = 0.0, 0.0
        async with s.post(h.url("/v1/chat/completions"), json=REQ) as r:
            assert r.status == 200
            body = await r.json()
        await asyncio.wait_for(policy.seen.wait(), 5)
    assert body["model"] == "m1" and body["choices"][0]["message"]["content"] == "Hello, world!"
    (o,) = policy.outcomes
    assert o.lookup_acceptance is None and o.ok and o.completion_tokens == 4 and o.prompt_tokens == 7


async def test_per_request_metrics_are_read_even_without_a_learning_sample() -> None:
    from gateway.api.state import STATE

    policy = RecordingPolicy()
    spec = FakeEngine("m1-spec", spec_metrics={"mean_acceptance_length": 2.5, "draft_acceptance_rate": 0.4})
    async with harness(spec=spec, policies={"m1": policy}) as h, aiohttp.ClientSession() as s:
        budget = h.app[STATE].lookup_budget("m1")
        budget.rate, budget.tokens = 0.0, 0.0
        for stream in (False, True):
            async with s.post(h.url("/v1/chat/completions"), json={**REQ, "stream": stream}) as r:
                assert r.status == 200
                assert b"m1-spec" not in await r.read()
        for _ in range(100):
            if len(policy.outcomes) == 2:
                break
            await asyncio.sleep(0.01)
    assert [o.reported_mean_acceptance_length for o in policy.outcomes] == [2.5, 2.5]
    assert [o.completion_tokens for o in policy.outcomes] == [4, 4]


async def test_engine_hop_by_hop_response_headers_are_not_relayed() -> None:
    base = FakeEngine(
        "m1-base",
        response_headers={
            "X-Engine-Info": "vllm",
            "Keep-Alive": "timeout=99",
            "Proxy-Authenticate": "Basic",
            "Set-Cookie": "session=abc",
            "Trailer": "X-Checksum",
        },
    )
    async with (
        harness(base=base) as h,
        aiohttp.ClientSession() as s,
        s.post(h.url("/v1/chat/completions"), json=REQ) as r,
    ):
        assert r.status == 200
        assert r.headers["X-Engine-Info"] == "vllm"
        for gone in ("Keep-Alive", "Proxy-Authenticate", "Set-Cookie", "Trailer"):
            assert gone not in r.headers, gone
        assert r.headers["x-specgate-engine"] == "base0"


@pytest.mark.parametrize("spaced", [False, True])
async def test_stream_fast_path_when_text_is_not_collected(spaced: bool) -> None:
    from gateway.api.state import STATE

    policy = RecordingPolicy()
    base = FakeEngine("m1-base", spaced_json=spaced)
    async with harness(base=base, policies={"m1": policy}) as h, aiohttp.ClientSession() as s:
        budget = h.app[STATE].lookup_budget("m1")
        budget.rate, budget.tokens = 0.0, 0.0  # no learning sample: the fast path relays the chunks
        body = {**REQ, "stream": True, "temperature": 0.9}
        async with s.post(h.url("/v1/chat/completions"), json=body) as r:
            raw = await r.read()
        await asyncio.wait_for(policy.seen.wait(), 5)
    events = [e for e in raw.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert all(c["model"] == "m1" for c in chunks) and b"m1-base" not in raw
    assert all(c["choices"] for c in chunks)  # the usage chunk the gateway asked for is not relayed
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "Hello, world!"
    (o,) = policy.outcomes
    assert o.ok and o.lookup_acceptance is None and o.completion_tokens == 4
    assert o.ttft_s is not None and o.tpot_s is not None


def test_token_kind_tells_content_reasoning_and_tool_calls_apart() -> None:
    from gateway.proxy.sse import CONTENT, NO_TOKEN, REASONING, token_kind

    assert token_kind(b'{"choices":[{"delta":{"content":"Hi"}}]}') == CONTENT
    assert token_kind(b'{"choices":[{"delta": {"content": "Hi"}}]}') == CONTENT
    assert token_kind(b'{"choices":[{"text":"x"}]}') == CONTENT
    assert token_kind(b'{"choices":[{"delta":{"role":"assistant","content":""}}]}') == NO_TOKEN
    assert token_kind(b'{"choices":[{"delta":{"reasoning_content":"thinking"}}]}') == REASONING
    assert token_kind(b'{"choices":[{"delta":{"reasoning": "thinking","content":null}}]}') == REASONING
    assert token_kind(b'{"choices":[{"delta":{"reasoning_content":""}}]}') == NO_TOKEN
    assert token_kind(b'{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c"}]}}]}') == CONTENT
    assert token_kind(b'{"choices":[{"delta":{"content":"say \\"content\\":\\"x"}}]}') == CONTENT
