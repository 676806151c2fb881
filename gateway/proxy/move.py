"""Move a stream to the sibling engine mid-answer, when the regime flips.

A flip leaves the old engine's streams running beside the new engine's, and on one GPU
every request then waits for both engines' steps until the old one drains. The policy
marks its flip (``Decision.move_from``); the surface asks the model's :class:`MoveBoard`
to move the streams on that route. Each relay that enlisted checks its :class:`MoveTicket`
between engine reads (a flag test, no timer), and when asked:

1. takes the text it has sent so far from the events it kept (bounded: a stream whose
   events outgrow :data:`MAX_KEPT_BYTES` withdraws);
2. asks the sibling how many tokens that text is (vLLM's ``/tokenize``) and for the rest
   of the answer (:mod:`gateway.pipeline.continuation`), with the attempt's first-byte
   budget;
3. once the sibling's first event is in, closes the old engine's response (vLLM aborts
   the request there) and relays the sibling's stream under the original ``id``, without
   its opening role chunk, its usage adjusted so the client sees one answer.

While the sibling is asked, the old engine's stream is not read (its events wait in the
socket): if the sibling cannot continue (unreachable, 5xx, too slow, nothing to ask),
the relay goes on with the old engine exactly where it paused. Nothing is lost either way.
A stream moves at most once.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import yarl

from gateway.engines.runtime import EngineRuntime
from gateway.pipeline.continuation import continuation_body, movable, tokenize_body, tokenize_count
from gateway.routing.types import Route
from gateway.wire.headers import REQUEST_ID, upstream_headers

log = logging.getLogger(__name__)

MAX_KEPT_BYTES = 512 * 1024  # events kept per stream for a move; beyond, the stream stays
TOKENIZE_BUDGET_S = 2.0  # at most this for the sibling's /tokenize (within the first-byte budget)
_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass(eq=False, slots=True)
class MoveTicket:
    """One stream that could move: its route, whether a move is asked, what it sent."""

    route: Route
    wanted: bool = False
    sent: list[bytes] = field(default_factory=list)
    sent_bytes: int = 0

    def keep(self, data: bytes) -> bool:
        """Keep the bytes sent to the client; False once they outgrow the bound."""
        self.sent_bytes += len(data)
        if self.sent_bytes > MAX_KEPT_BYTES:
            self.sent.clear()
            return False
        self.sent.append(data)
        return True


class MoveBoard:
    """The streams of one model that could move (a set of tickets; no I/O)."""

    __slots__ = ("_tickets",)

    def __init__(self) -> None:
        self._tickets: set[MoveTicket] = set()

    def __len__(self) -> int:
        return len(self._tickets)

    def enlist(self, route: Route) -> MoveTicket:
        t = MoveTicket(route)
        self._tickets.add(t)
        return t

    def withdraw(self, ticket: MoveTicket) -> None:
        self._tickets.discard(ticket)

    def move(self, route: Route) -> int:
        """Ask every stream on ``route`` to move to its sibling; returns how many were asked."""
        n = 0
        for t in self._tickets:
            if t.route is route and not t.wanted:
                t.wanted = True
                n += 1
        return n


@dataclass(slots=True)
class Continuation:
    """How the sibling's events are rewritten into the client's stream."""

    id: str | None
    created: int | None
    tokens_before: int  # tokens of the answer the old engine produced
    opened: bool = False  # a content chunk went through (the opening role chunk is dropped)

    def apply(self, obj: dict[str, Any]) -> bool:
        """Rewrite one event object in place; False to drop it."""
        choices = obj.get("choices")
        if not self.opened and isinstance(choices, list) and choices and "usage" not in obj:
            if all(_opening(c) for c in choices):
                return False
            self.opened = True
        if self.id is not None and "id" in obj:
            obj["id"] = self.id
        if self.created is not None and "created" in obj:
            obj["created"] = self.created
        usage = obj.get("usage")
        if isinstance(usage, dict):
            pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(pt, int) and isinstance(ct, int):
                usage["prompt_tokens"] = max(0, pt - self.tokens_before)
                usage["completion_tokens"] = ct + self.tokens_before
        return True


def _opening(choice: object) -> bool:
    """A chunk that opens a chat answer: a role and no content, no finish."""
    if not isinstance(choice, dict) or choice.get("finish_reason") is not None:
        return False
    delta = choice.get("delta")
    return isinstance(delta, dict) and not delta.get("content") and not delta.get("tool_calls")


def sent_answer(sent: list[bytes]) -> tuple[str, str | None, int | None] | None:
    """(text, id, created) of the events sent so far; None when they hold an error or
    anything but one choice's text."""
    parts: list[str] = []
    rid: str | None = None
    created: int | None = None
    for ev in b"".join(sent).split(b"\n\n"):
        if not ev.startswith(b"data:"):
            continue
        data = ev[5:].strip()
        if data == b"[DONE]":
            return None
        try:
            obj = json.loads(data)
        except ValueError:
            return None
        if not isinstance(obj, dict) or "error" in obj:
            return None
        if rid is None and isinstance(obj.get("id"), str):
            rid = obj["id"]
            c = obj.get("created")
            created = c if isinstance(c, int) and not isinstance(c, bool) else None
        for c in obj.get("choices") or ():
            if not isinstance(c, dict) or c.get("index", 0) != 0:
                return None
            delta = c.get("delta")
            text = delta.get("content") if isinstance(delta, dict) else c.get("text")
            if isinstance(text, str):
                parts.append(text)
    return "".join(parts), rid, created


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
    if answer is None or not answer[0]:
        return "nothing_to_move"
    text, rid, created = answer
    loop = asyncio.get_running_loop()
    first_deadline = min(deadline, loop.time() + req.first_byte_s)
    served = sibling.config.served_model_name
    headers = upstream_headers(req.client_headers, req.forward_headers)
    headers[REQUEST_ID] = req.request_id
    headers["Content-Type"] = "application/json"
    headers.update(sibling.config.auth_headers())
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=req.connect_s)
    base = sibling.config.url
    try:
        async with asyncio.timeout_at(min(first_deadline, loop.time() + TOKENIZE_BUDGET_S)):
            async with session.post(
                yarl.URL(base + "/tokenize"),
                json=tokenize_body(text, served),
                headers=headers,
                timeout=timeout,
            ) as tr:
                n = tokenize_count(await tr.json(content_type=None)) if tr.status == 200 else None
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
        n = None
    if n is None:
        return "tokenize"
    body = continuation_body(req.body, req.endpoint, text, n, served)
    if body is None:
        return "nothing_to_move"
    resp: aiohttp.ClientResponse | None = None
    try:
        async with asyncio.timeout_at(first_deadline):
            resp = await session.post(
                yarl.URL(base + _PATHS[req.endpoint]), json=body, headers=headers, timeout=timeout
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
    return resp, chunk, Continuation(rid, created, n)
