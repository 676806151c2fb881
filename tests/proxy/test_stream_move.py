"""A regime flip moves a running stream to the sibling engine: OpenAI SDK → gateway →
emulated vLLM pair (real sockets). The client sees one answer: the same text as without
the move (greedy decoding continues its own answer), one id, one opening chunk, usage
that counts the whole answer; the old engine aborts the request."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer

from gateway.api.app import build_app
from gateway.api.state import STATE
from gateway.proxy import handoff
from gateway.proxy.move import MOVE, ORDER_WAIT_S, MoveBoard, MoveTicket
from gateway.routing.rules import apply_hard_rules, decide_route
from gateway.routing.types import Decision, ModelView, Outcome, Reason, RequestFeatures, Route
from gateway.telemetry import build_telemetry
from specgate_lab.emulator.launch import EmulatorGroup, pair_launches, start_group
from tests.conftest import gateway_config_for
from tests.reliability.rig import until

pytestmark = pytest.mark.timeout(90)

EDIT = [
    {
        "role": "user",
        "content": "Add type hints, return the full file unchanged otherwise:\n```python\n"
        + "".join(f"def f{i}(a, b):\n    return a * {i} + b\n\n" for i in range(40))
        + "```",
    }
]
TOKENS = 240


@dataclass
class Flipper:
    """Spec until told to flip; the flip's decision names the route to move from."""

    name: str = "flipper"
    flip: bool = False
    moved_once: bool = False
    outcomes: list[Outcome] = field(default_factory=list)
    observed: asyncio.Event = field(default_factory=asyncio.Event)

    def decide(self, features: RequestFeatures, view: ModelView, now: float) -> Decision:
        pre = apply_hard_rules(features, view)
        if pre.decision is not None:
            return pre.decision
        if not self.flip:
            return decide_route(pre.pair, Route.SPEC, Reason.PREDICTED_FASTER, predicted_tpot_s=0.005)
        move = None if self.moved_once else Route.SPEC
        self.moved_once = True
        return decide_route(pre.pair, Route.BASE, Reason.BELOW_BREAK_EVEN, move_from=move)

    def observe(self, outcome: Outcome, now: float) -> None:
        self.outcomes.append(outcome)
        self.observed.set()

    async def outcomes_of(self, tokens: int, n: int) -> list[Outcome]:
        """The first ``n`` outcomes of ``tokens``-token answers, once observed (learning
        runs after the response, in the background when it replays the answer)."""
        while len(got := [o for o in self.outcomes if o.completion_tokens == tokens]) < n:
            self.observed.clear()
            await asyncio.wait_for(self.observed.wait(), 30)
        return got[:n]

    def snapshot(self) -> dict[str, object]:
        return {}


@pytest.fixture
async def slow_pair() -> AsyncIterator[EmulatorGroup]:
    """A pair in real time: a 240-token answer takes over a second, so a flip lands mid-stream."""
    group = await start_group(pair_launches(port_spec=0, port_base=0), time_scale=1.0)
    try:
        yield group
    finally:
        await group.stop()


@contextlib.asynccontextmanager
async def _gateway(
    group: EmulatorGroup, policy: Flipper
) -> AsyncIterator[tuple[TestServer, openai.AsyncOpenAI]]:
    """The gateway (real telemetry) in front of ``group`` with ``policy``, and an SDK client."""
    tel = build_telemetry({"tracing": "off", "process_metrics": False}, known_models=["qwen3-8b"])
    gw = TestServer(build_app(gateway_config_for(group), telemetry=tel, policies={"qwen3-8b": policy}))
    await gw.start_server()
    client = await asyncio.to_thread(
        openai.AsyncOpenAI, base_url=str(gw.make_url("/v1")), api_key="unused", max_retries=0
    )
    try:
        yield gw, client
    finally:
        await client.close()
        await gw.close()


# the streamed greedy edit every test here sends (ignore_eos: it runs to max_tokens)
EDIT_STREAM: dict[str, Any] = {
    "model": "qwen3-8b",
    "messages": EDIT,
    "temperature": 0,
    "max_tokens": TOKENS,
    "stream": True,
    "extra_body": {"ignore_eos": True},
}


async def _stream(
    client: openai.AsyncOpenAI, on_chunk: Callable[[int], Any] | None = None, **extra: Any
) -> dict[str, Any]:
    stream = await client.chat.completions.create(
        **{**EDIT_STREAM, **extra}, stream_options={"include_usage": True}
    )
    text, ids, roles, usage, finish = "", set(), 0, None, None
    n = 0
    async for chunk in stream:
        ids.add(chunk.id)
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            roles += c.delta.role is not None
            text += c.delta.content or ""
            finish = c.finish_reason or finish
        n += 1
        if on_chunk is not None:
            await on_chunk(n)
    return {"text": text, "ids": ids, "roles": roles, "usage": usage, "finish": finish}


async def _metric(url: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` at ``url``/metrics whose labels include ``labels``."""
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        body = await r.text()
    total = 0.0
    for line in body.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def _aborted(url: str, n: int) -> bool:
    return await _metric(url, "vllm:request_success_total", finished_reason="abort") == n


@pytest.mark.parametrize("extra", [{}, {"seed": 7}], ids=["greedy", "greedy-seeded"])
async def test_a_flip_moves_the_stream_and_the_client_sees_one_answer(
    slow_pair: EmulatorGroup, extra: dict[str, Any]
) -> None:
    spec, base = slow_pair.engines
    policy = Flipper()
    async with _gateway(slow_pair, policy) as (gw, client):
        reference = await _stream(client, **extra)  # all on spec
        flipped = asyncio.Event()

        async def flip_after_some(n: int) -> None:
            if n == 8 and not flipped.is_set():
                policy.flip = True
                other = await client.chat.completions.create(
                    model="qwen3-8b", messages=[{"role": "user", "content": "hi"}], max_tokens=2
                )
                assert other.choices[0].message.content is not None
                flipped.set()

        moved = await _stream(client, flip_after_some, **extra)
        assert flipped.is_set()
        # one answer: the same greedy text, one id, one opening chunk, the whole usage. The
        # sibling is asked for the tokens left by its own count of the text so far, which
        # can split it otherwise than the answer's tokens did: the end of an answer cut at
        # max_tokens may then differ by a token or two (the seeded text here does).
        a, b = moved["text"], reference["text"]
        if not extra:
            assert a == b
        else:
            assert (a.startswith(b) or b.startswith(a)) and abs(len(a) - len(b)) < 16
        assert len(moved["ids"]) == 1 and moved["roles"] == 1
        assert moved["finish"] == "length"
        assert moved["usage"].completion_tokens == reference["usage"].completion_tokens == TOKENS
        # the prompt is the original's (the sibling's /tokenize of it), not the continued one's
        assert moved["usage"].prompt_tokens == reference["usage"].prompt_tokens
        # the spec engine aborted it; the plain engine finished the continuation
        # the engine counts the abort when it sees the gateway's disconnect: soon, not at once
        await until(lambda: _aborted(spec.url, 1), what="spec engine counts the moved stream as aborted")
        # (and the flip's own 2-token request)
        assert await _metric(base.url, "vllm:request_success_total", finished_reason="length") == 2
        gw_url = str(gw.make_url("")).rstrip("/")
        assert await _metric(gw_url, "specgate_stream_moves_total", engine="spec0", result="moved") == 1
        # learning: the moved answer is the plain engine's now, and no measurement of spec
        long = await policy.outcomes_of(TOKENS, 2)
        assert [o.route for o in long] == [Route.SPEC, Route.BASE]
        assert long[0].predicted_tpot_s == 0.005 and long[1].predicted_tpot_s is None
        st = gw.app[STATE]
        assert len(st.moves["qwen3-8b"]) == 0  # every ticket withdrawn
        assert all(e.inflight == 0 for e in st.models["qwen3-8b"].engines.values())


async def _flip_during(client: openai.AsyncOpenAI, policy: Flipper, **extra: Any) -> dict[str, Any]:
    """Stream the edit; after 8 chunks flip the policy with a short request."""

    async def flip(n: int) -> None:
        if n == 8 and not policy.flip:
            policy.flip = True
            await client.chat.completions.create(
                model="qwen3-8b", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )

    return await _stream(client, flip, **extra)


async def test_a_sibling_that_cannot_continue_leaves_the_stream_where_it_was(
    slow_pair: EmulatorGroup,
) -> None:
    """The plain engine fails every generation (HTTP 500): the move is abandoned before
    anything changed, and the answer comes whole from the spec engine."""
    spec, base = slow_pair.engines
    policy = Flipper()
    async with _gateway(slow_pair, policy) as (gw, client):
        reference = await _stream(client)
        async with (
            aiohttp.ClientSession() as s,
            s.post(base.url + "/_emulator/faults", json={"error_rate": 1.0}) as r,
        ):
            assert r.status == 200
        kept = await _flip_during(client, policy)
        assert kept["text"] == reference["text"] and len(kept["ids"]) == 1
        assert kept["usage"].completion_tokens == TOKENS and kept["finish"] == "length"
        assert await _metric(spec.url, "vllm:request_success_total", finished_reason="abort") == 0
        gw_url = str(gw.make_url("")).rstrip("/")
        assert await _metric(gw_url, "specgate_stream_moves_total", engine="spec0", result="status_500") == 1
        assert await _metric(gw_url, "specgate_stream_moves_total", result="moved") == 0
        assert all(e.inflight == 0 for e in gw.app[STATE].models["qwen3-8b"].engines.values())


async def test_a_stream_whose_continuation_would_differ_stays(slow_pair: EmulatorGroup) -> None:
    """A seeded sampled request must reproduce its answer: it never moves (no ticket), and
    the flip leaves it to finish on the engine it started on. (A seeded greedy one moves:
    at temperature 0 the seed changes nothing.)"""
    spec, _ = slow_pair.engines
    policy = Flipper()
    async with _gateway(slow_pair, policy) as (gw, client):
        kept = await _flip_during(client, policy, seed=7, temperature=0.8)
        assert kept["usage"].completion_tokens == TOKENS and len(kept["ids"]) == 1
        assert await _metric(spec.url, "vllm:request_success_total", finished_reason="abort") == 0
        assert await _metric(spec.url, "vllm:request_success_total", finished_reason="length") == 1
        assert len(gw.app[STATE].moves["qwen3-8b"]) == 0


async def test_draining_an_engine_with_move_hands_its_streams_to_the_sibling(
    slow_pair: EmulatorGroup,
) -> None:
    """Before a restart: ``POST /admin/drain {"engine", "move": true}`` sends new requests
    elsewhere and moves the engine's running streams to the sibling now, so the engine is
    empty at once and the client still gets its whole answer."""
    spec, base = slow_pair.engines
    async with _gateway(slow_pair, Flipper()) as (gw, client):
        reference = await _stream(client)
        answered: dict[str, Any] = {}

        async def drain(n: int) -> None:
            if n == 8:
                async with (
                    aiohttp.ClientSession() as s,
                    s.post(str(gw.make_url("/admin/drain")), json={"engine": "spec0", "move": True}) as r,
                ):
                    answered.update(await r.json())

        moved = await _stream(client, drain)
        assert answered == {
            "engine": "spec0",
            "draining": True,
            "inflight": 1,
            "moving": 1,
            "moving_later": 0,
        }
        assert moved["text"] == reference["text"] and moved["usage"].completion_tokens == TOKENS
        # the engine counts the abort when it sees the gateway's disconnect: soon, not at once
        await until(lambda: _aborted(spec.url, 1), what="spec engine counts the moved stream as aborted")
        assert await _metric(base.url, "vllm:request_success_total", finished_reason="length") == 1
        assert gw.app[STATE].models["qwen3-8b"].engines["spec0"].inflight == 0


async def test_a_moving_stream_counts_on_the_sibling_from_the_moment_it_is_asked(
    slow_pair: EmulatorGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the sibling is asked to continue (its request may queue there for seconds) the
    stream is on both engines, and the gateway's own counts say so: counted on the sibling
    only at its first event, the engine's scraped gauges showed it as another replica's
    request, and the adaptive policy took the pair for a shared one."""
    seen: list[tuple[int, int]] = []
    real = handoff.continue_on

    async def spy(req: Any, sibling: Any, session: Any, ticket: Any, deadline: float) -> Any:
        engines = gw.app[STATE].models["qwen3-8b"].engines
        seen.append((engines["spec0"].inflight, sibling.inflight))
        return await real(req, sibling, session, ticket, deadline)

    monkeypatch.setattr(handoff, "continue_on", spy)
    async with _gateway(slow_pair, Flipper()) as (gw, client):

        async def drain(n: int) -> None:
            if n == 8:
                async with (
                    aiohttp.ClientSession() as s,
                    s.post(str(gw.make_url("/admin/drain")), json={"engine": "spec0", "move": True}) as r,
                ):
                    assert r.status == 200

        moved = await _stream(client, drain)
        assert moved["usage"].completion_tokens == TOKENS
        assert seen == [(1, 1)]  # the one stream, on the old engine and on the sibling
        engines = gw.app[STATE].models["qwen3-8b"].engines
        assert all(e.inflight == 0 for e in engines.values())
        # the old engine aborts it a step later: its view says when it was let go
        closes = engines["spec0"].view(time.monotonic(), 5.0).closed_at
        assert len(closes) == 1 and engines["base0"].view(0.0, 5.0).closed_at == ()


async def test_a_stream_still_waiting_for_its_first_byte_goes_to_the_sibling_at_a_flip(
    slow_pair: EmulatorGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream queued on the old engine (no byte yet: here the spec engine holds every
    request before answering) is sent to the sibling the moment the regime flips, as a
    failover that blames nobody: the client gets its whole answer from the plain engine."""
    spec, _ = slow_pair.engines
    policy = Flipper()
    enlisted = asyncio.Event()
    enlist = MoveBoard.enlist

    def spy(board: MoveBoard, route: Route, engine: str) -> MoveTicket:
        enlisted.set()
        return enlist(board, route, engine)

    monkeypatch.setattr(MoveBoard, "enlist", spy)
    async with _gateway(slow_pair, policy) as (gw, client):
        try:
            async with (
                aiohttp.ClientSession() as s,
                s.post(spec.url + "/_emulator/faults", json={"hang": "accept"}) as r,
            ):
                assert r.status == 200
            queued = asyncio.create_task(client.chat.completions.with_raw_response.create(**EDIT_STREAM))
            st = gw.app[STATE]
            await asyncio.wait_for(enlisted.wait(), 30)  # it waits for spec's first byte, on the board
            policy.flip = True
            await client.chat.completions.create(
                model="qwen3-8b", messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            raw = await asyncio.wait_for(queued, 30)
            assert raw.headers["x-specgate-route"] == "base" and raw.headers["x-specgate-reason"] == "moved"
            text = "".join([c.choices[0].delta.content or "" async for c in raw.parse() if c.choices])
            assert text
            engines = st.models["qwen3-8b"].engines
            assert engines["spec0"].consecutive_failures == 0  # not blamed
            assert all(e.inflight == 0 for e in engines.values()) and len(st.moves["qwen3-8b"]) == 0
            gw_url = str(gw.make_url("")).rstrip("/")
            assert (
                await _metric(gw_url, "specgate_stream_moves_total", engine="spec0", result="moved_queued")
                == 1
            )
            assert await _metric(gw_url, "specgate_upstream_failures_total") == 0
        finally:
            async with (
                aiohttp.ClientSession() as s,
                s.post(spec.url + "/_emulator/faults", json={"hang": "none"}) as r,
            ):
                pass


async def test_a_move_sends_the_answering_streams_before_the_queued_ones() -> None:
    """The queued requests of a move wait for its answering streams (each withdraws once
    its continuation is answered or it stays), then go in the order they came; with no
    answering stream they go at once, and a stream that never reports holds them at most
    ``ORDER_WAIT_S``."""
    board = MoveBoard()
    answering = [board.enlist(Route.SPEC, "spec0") for _ in range(2)]
    for t in answering:  # in their content phase: they can move now
        t.keep(b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n')
    cancelled: list[int] = []

    async def queued_request(i: int) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError as exc:
            assert MOVE in exc.args
            cancelled.append(i)

    tasks = [asyncio.create_task(queued_request(i)) for i in range(3)]
    queued = [board.enlist(Route.SPEC, "spec0") for _ in tasks]
    for ticket, task in zip(queued, tasks, strict=True):
        ticket.waiting = task
    other = board.enlist(Route.BASE, "base0")  # not on the flipped route
    await asyncio.sleep(0)
    assert board.move(Route.SPEC) == (5, 0)
    assert all(t.wanted for t in answering + queued) and not other.wanted
    board.withdraw(answering[0])  # one continuation answered
    await asyncio.sleep(0)
    assert cancelled == []  # the other stream still asks the sibling
    board.withdraw(answering[1])
    await asyncio.gather(*tasks)
    assert cancelled == [0, 1, 2]  # then the queued ones, in their order

    late = asyncio.create_task(queued_request(9))
    ticket = board.enlist(Route.BASE, "base0")
    ticket.waiting = late
    await asyncio.sleep(0)
    other.keep(b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n')
    assert board.move(Route.BASE) == (2, 0)  # `other` answers (never reports here), `ticket` waits
    await asyncio.sleep(0)
    assert cancelled == [0, 1, 2]
    await asyncio.wait_for(late, ORDER_WAIT_S + 5.0)  # released by the bound
    assert cancelled[-1] == 9


async def test_a_flip_keeps_the_order_of_the_streams_it_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    """One slot per engine: a stream answers on spec while another request queues behind
    it. At the flip the answering stream's continuation reaches the plain engine first and
    the queued request follows it there: re-sent at once, the whole queued request would
    take the slot and the moved stream would wait mid-answer for all of it."""
    group = await start_group(pair_launches(port_spec=0, port_base=0, max_num_seqs=1), time_scale=1.0)
    enlisted: list[MoveTicket] = []
    two = asyncio.Event()
    enlist = MoveBoard.enlist

    def spy(board: MoveBoard, route: Route, engine: str) -> MoveTicket:
        t = enlist(board, route, engine)
        enlisted.append(t)
        if len(enlisted) >= 2:
            two.set()
        return t

    monkeypatch.setattr(MoveBoard, "enlist", spy)
    policy = Flipper()
    try:
        async with _gateway(group, policy) as (gw, client):
            queued_first: list[float] = []

            async def queued_stream() -> dict[str, Any]:
                async def first(n: int) -> None:
                    if n == 1:
                        queued_first.append(time.monotonic())

                return await _stream(client, first)

            second: asyncio.Task[dict[str, Any]] | None = None

            async def flip(n: int) -> None:
                nonlocal second
                if n == 8 and second is None:
                    second = asyncio.create_task(queued_stream())
                    await asyncio.wait_for(two.wait(), 30)  # it waits on spec, on the board
                    policy.flip = True
                    await client.chat.completions.create(
                        model="qwen3-8b", messages=[{"role": "user", "content": "hi"}], max_tokens=2
                    )

            moved = await _stream(client, flip)
            moved_done = time.monotonic()
            assert second is not None
            queued = await asyncio.wait_for(second, 60)
            assert moved["usage"].completion_tokens == queued["usage"].completion_tokens == TOKENS
            # the queued request started on the plain engine only once the moved stream ended
            assert queued_first and queued_first[0] >= moved_done
            gw_url = str(gw.make_url("")).rstrip("/")
            assert await _metric(gw_url, "specgate_stream_moves_total", engine="spec0", result="moved") == 1
            assert (
                await _metric(gw_url, "specgate_stream_moves_total", engine="spec0", result="moved_queued")
                == 1
            )
    finally:
        await group.stop()
