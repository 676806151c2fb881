"""The relay's side of a move (:mod:`gateway.proxy.move`): ask the sibling engine for the
rest of the answer, and hand the stream over to it when it answers."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import yarl

from gateway.engines.runtime import EngineRuntime
from gateway.pipeline.continuation import (
    assistant_text,
    continuation_body,
    movable,
    prompt_tokenize_body,
    tokenize_body,
    tokenize_count,
)
from gateway.pipeline.request import CHAT
from gateway.proxy.move import Continuation, MoveBoard, MoveTicket, sent_answer
from gateway.proxy.pool import UpstreamPool
from gateway.proxy.relay import Relay, client_timeout, engine_headers, upstream_url
from gateway.routing.types import Decision

log = logging.getLogger(__name__)

TOKENIZE_BUDGET_S = 2.0  # at most this for the sibling's /tokenize (within the first-byte budget)


@dataclass(slots=True)
class TicketHold:
    """The move-board ticket of one request, from its first attempt to its end."""

    ticket: MoveTicket | None = None


@dataclass(slots=True)
class MoveRequest:
    """What a move needs of the request (the relay's :class:`~gateway.proxy.forward.ProxyCall`)."""

    body: dict[str, Any]
    endpoint: str
    request_id: str
    client_headers: Any  # the client's request headers (allow-listed before forwarding)
    forward_headers: frozenset[str]
    connect_s: float
    first_byte_s: float

    def can_move(self) -> bool:
        return movable(self.body, self.endpoint)


async def continue_on(
    req: MoveRequest,
    sibling: EngineRuntime,
    session: aiohttp.ClientSession,
    ticket: MoveTicket,
    deadline: float,
) -> tuple[aiohttp.ClientResponse, bytes, Continuation] | str:
    """Ask ``sibling`` for the rest of the answer. Returns its response, its first bytes and
    the rewriting, or why it could not (``nothing_to_move``, ``tokenize``, ``connect``,
    ``status_NNN``, ``first_byte_timeout``, ``disconnected``): the stream then stays."""
    answer = sent_answer(ticket.sent)
    if answer is None or not answer.content:  # finished, or not in its content phase
        return "nothing_to_move"
    text = assistant_text(answer.reasoning, answer.content) if req.endpoint == CHAT else answer.content
    loop = asyncio.get_running_loop()
    first_deadline = min(deadline, loop.time() + req.first_byte_s)
    served = sibling.config.served_model_name
    headers = engine_headers(req.client_headers, req.forward_headers, req.request_id, sibling)
    timeout = client_timeout(req.connect_s)
    base = sibling.config.url

    async def count(tb: dict[str, Any]) -> int | None:
        async with session.post(
            yarl.URL(base + "/tokenize"), json=tb, headers=headers, timeout=timeout
        ) as tr:
            return tokenize_count(await tr.json(content_type=None)) if tr.status == 200 else None

    try:
        async with asyncio.timeout_at(min(first_deadline, loop.time() + TOKENIZE_BUDGET_S)):
            prompt_n, n = await asyncio.gather(
                count(prompt_tokenize_body(req.body, req.endpoint, served)),
                count(tokenize_body(text, served)),
            )
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
        prompt_n = n = None
    if prompt_n is None or n is None:
        return "tokenize"
    body = continuation_body(req.body, req.endpoint, text, n, served)
    if body is None:
        return "nothing_to_move"
    resp: aiohttp.ClientResponse | None = None
    try:
        async with asyncio.timeout_at(first_deadline):
            resp = await session.post(
                upstream_url(base, req.endpoint), json=body, headers=headers, timeout=timeout
            )
            if resp.status != 200 or not resp.headers.get("Content-Type", "").startswith("text/event-stream"):
                resp.close()
                return f"status_{resp.status}"
            chunk = resp.content.read_nowait()
            if not chunk and not resp.content.at_eof():
                chunk = await resp.content.readany()
    except TimeoutError:
        if resp is not None:
            resp.close()
        return "first_byte_timeout"
    except (aiohttp.ClientError, OSError):
        if resp is not None:
            resp.close()
        return "connect" if resp is None else "disconnected"
    if not chunk:
        resp.close()
        return "disconnected"
    return resp, chunk, Continuation(answer.id, answer.created, n, prompt_n)


# Why a move did not happen that is nobody's failure (the sibling was not asked, or has
# nothing to add): not held against the sibling's health.
_NOT_THE_ENGINES = frozenset({"nothing_to_move"})


@dataclass(slots=True)
class Side:
    """The engine a stream is relayed from, and its response (the sibling's after a move)."""

    rt: EngineRuntime
    resp: aiohttp.ClientResponse
    first: bytes = b""  # the sibling's first bytes, read before the move was made


def release(resp: aiohttp.ClientResponse, rt: EngineRuntime) -> None:
    """Keep the connection only when the response was read to the end; else close it, which
    is what makes the engine abort the request (``rt`` is told: its gauges count the request
    a moment longer). A response closed already (a moved stream's) is left as it is."""
    if resp.content.is_eof():
        resp.release()
    elif not resp.closed:
        resp.close()
        rt.closed_early()


class MoveRelay(Relay):
    """Mixin of :class:`gateway.proxy.forward.ProxyCall`: a stream's move to the sibling."""

    __slots__ = ()

    # The model's streams that could move at a regime flip; None: this stream never moves.
    moves: MoveBoard | None
    move_request: MoveRequest | None
    hold: TicketHold  # this stream's ticket on the move board (ProxyCall.run enlists it)
    engines: Mapping[str, EngineRuntime]
    pool: UpstreamPool
    decision: Decision

    def _enlist(self, rt: EngineRuntime) -> MoveTicket | None:
        """The stream's ticket on the model's move board (the one it waited for its first byte
        with, or a new one) when it could continue on its sibling; else None."""
        ticket, self.hold.ticket = self.hold.ticket, None
        if self.moves is None or self.move_request is None or self._sibling(rt) is None:
            if ticket is not None:
                self._withdraw(ticket)
            return None
        self.hold.ticket = ticket or self.moves.enlist(rt.route, rt.name)
        return self.hold.ticket

    def _withdraw(self, ticket: MoveTicket) -> None:
        if self.moves is not None:
            self.moves.withdraw(ticket)
        if self.hold.ticket is ticket:
            self.hold.ticket = None

    def _sibling(self, rt: EngineRuntime) -> EngineRuntime | None:
        """The other engine of the pair the decision chose (a usable one), if any."""
        d = self.decision
        name = d.fallback if rt.name == d.engine else d.engine
        other = self.engines.get(name) if name else None
        ok = other is not None and other is not rt and other.healthy() and not other.draining
        return other if ok else None

    async def _move(self, side: Side, ticket: MoveTicket, deadline: float) -> Continuation | None:
        """Continue the answer on the sibling (:func:`gateway.proxy.move.continue_on`); on
        success ``side`` is the sibling's and the old engine's response is closed (vLLM
        aborts the request there), else nothing changed and the old stream goes on."""
        sibling = self._sibling(side.rt)
        req = self.move_request
        if sibling is None or req is None:
            return None
        # The continuation is the sibling's request from the moment it is asked (it may queue
        # there for seconds): counted there at once, the engine's scraped gauges never show
        # this gateway's own request as another replica's (routing.adaptive.shared).
        sibling.inflight += 1
        try:
            got = await continue_on(req, sibling, self.pool.session(sibling.name), ticket, deadline)
        except BaseException:
            sibling.inflight -= 1
            raise
        if isinstance(got, str):
            sibling.inflight -= 1
            if got not in _NOT_THE_ENGINES:
                sibling.record_failure(got)
            self._moved(side.rt.name, got)
            return None
        resp, first, cont = got
        sibling.record_success()
        release(side.resp, side.rt)  # the old engine aborts the request
        side.rt.inflight -= 1
        self._moved(side.rt.name, "moved")
        side.rt, side.resp, side.first = sibling, resp, first
        return cont

    def _moved(self, engine: str, result: str) -> None:
        try:
            self.telemetry.stream_moved(engine, result)
        except Exception:
            log.exception("telemetry stream_moved failed")
