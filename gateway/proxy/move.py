"""Move a stream to the sibling engine mid-answer, when the regime flips.

A flip leaves the old engine's streams running beside the new engine's, and on one GPU
every request then waits for both engines' steps until the old one drains. The policy
marks its flip (``Decision.move_from``); the surface asks the model's :class:`MoveBoard`
to move the streams on that route. Each relay that enlisted checks its :class:`MoveTicket`
between engine reads (a flag test, no timer), and when asked:

1. takes the answer it has sent so far (reasoning and content) from the events it kept
   (bounded: a stream whose events outgrow :data:`MAX_KEPT_BYTES` withdraws); a stream
   still before its content (thinking) waits for its first content, and a finished one
   (a ``finish_reason`` sent) never moves (:attr:`MoveTicket.phase`);
2. asks the sibling how many tokens the original prompt and that answer are (vLLM's
   ``/tokenize``) and for the rest of the answer (:mod:`gateway.pipeline.continuation`),
   with the attempt's first-byte budget;
3. once the sibling's first event is in, closes the old engine's response (vLLM aborts
   the request there) and relays the sibling's stream under the original ``id``, without
   its opening role chunk, its reasoning deltas delivered as content, its usage adjusted
   so the client sees one answer (:class:`Continuation`).

While the sibling is asked, the old engine's stream is not read (its events wait in the
socket): if the sibling cannot continue (unreachable, 5xx, too slow, nothing to ask),
the relay goes on with the old engine exactly where it paused. Nothing is lost either way.
A stream moves at most once.

A move keeps the requests' order on the new engine. The streams already answering go
first; the requests still queued on the old engine (no first byte yet: sent again, whole)
follow once every answering stream of the move has had its continuation answered or
given up (:class:`MoveGate`, at most :data:`ORDER_WAIT_S`), in the order they came.
vLLM admits requests first come, first served: re-sent at once, a saturated engine's
queue reached the sibling before the continuations, which need a ``/tokenize`` round
trip first, and took its batch; the moved streams then waited mid-answer behind whole
requests (a real H200 day: 207-363 queued requests moved with 15-67 answering streams,
and the streams read 14-15 ms per token against 10-11 for the requests from the queue).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gateway.proxy import sse
from gateway.proxy.sse import REASONING_FIELDS, finishes, reasoning_of, token_kind
from gateway.routing.types import Route

MAX_KEPT_BYTES = 512 * 1024  # events kept per stream for a move; beyond, the stream stays
ORDER_WAIT_S = 5.0  # the queued requests of a move wait at most this for its streams


# Cancel message of an attempt moved before its first byte (``task.cancel(MOVE)``): the
# attempt ends (its response closed, so the engine drops the queued request) and the
# request goes to the sibling, as a failover that blames nobody.
MOVE = "specgate: moved to the sibling engine"


# What a stream has sent the client so far (:meth:`MoveTicket.keep` follows it, a byte scan
# per write): only an answer in its content phase can be continued elsewhere. Before its
# first content (still thinking, or only the role chunk) the continuation cannot be written
# as a chat message (Qwen3's template renders a final assistant message after an ended
# think block), and a finished answer (a ``finish_reason`` sent) has nothing to continue.
OPENING, CONTENT, FINISHED = "opening", "content", "finished"


@dataclass(eq=False, slots=True)
class MoveTicket:
    """One stream that could move: its route, whether a move is asked, what it sent."""

    route: Route
    engine: str
    wanted: bool = False
    # While the request waits for its engine's first byte (queued there): the task to cancel
    # with :data:`MOVE` so that the attempt goes to the sibling at once; None once relaying.
    waiting: asyncio.Task[Any] | None = None
    sent: list[bytes] = field(default_factory=list)
    sent_bytes: int = 0
    gate: MoveGate | None = None  # the move this answering stream holds the queued ones for
    phase: str = OPENING  # OPENING, CONTENT or FINISHED: what the client has been sent

    def keep(self, data: bytes) -> bool:
        """Keep the bytes sent to the client; False once they outgrow the bound."""
        self.sent_bytes += len(data)
        if self.sent_bytes > MAX_KEPT_BYTES:
            self.sent.clear()
            return False
        self.sent.append(data)
        if self.phase != FINISHED:
            if finishes(data):
                self.phase = FINISHED
            elif self.phase == OPENING and token_kind(data) == sse.CONTENT:
                self.phase = CONTENT
        return True

    @property
    def can_move(self) -> bool:
        """Whether a move asked now can happen now: queued, or answering its content."""
        return self.waiting is not None or self.phase == CONTENT


class Asked(NamedTuple):
    """What a move asked: ``moving`` streams move now (queued, or answering their content);
    ``later`` ones are still thinking (or have sent only their opening chunk) and move once
    their content begins, unless they end first."""

    moving: int
    later: int


class MoveGate:
    """One move's queued requests, held until its answering streams were asked on the
    sibling: each stream reports once (:meth:`MoveBoard.withdraw`), and the last report,
    or :data:`ORDER_WAIT_S`, sends the queued ones on in their order. With nothing
    answering (or nothing queued, or no event loop to wait on) they go at once."""

    __slots__ = ("_pending", "_queued", "_timer")

    def __init__(self, pending: int, queued: list[MoveTicket]) -> None:
        self._pending = pending
        self._queued = queued
        self._timer: asyncio.TimerHandle | None = None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a pure caller): nothing can wait
            loop = None
        if loop is None or pending <= 0 or not queued:
            self.release()
        else:
            self._timer = loop.call_later(ORDER_WAIT_S, self.release)

    @property
    def holding(self) -> bool:
        """Whether queued requests still wait for the move's streams."""
        return bool(self._queued)

    def report(self) -> None:
        """One answering stream of the move has its continuation (or stays)."""
        self._pending -= 1
        if self._pending <= 0:
            self.release()

    def release(self) -> None:
        """Send the held queued requests to the sibling, in the order they came (those that
        got their first byte meanwhile are answering streams now: their relay moves them)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        queued, self._queued = self._queued, []
        for t in queued:
            if t.waiting is not None:
                t.waiting.cancel(MOVE)


class MoveBoard:
    """The streams of one model that could move, in the order they enlisted (no I/O)."""

    __slots__ = ("_tickets",)

    def __init__(self) -> None:
        self._tickets: dict[MoveTicket, None] = {}

    def __len__(self) -> int:
        return len(self._tickets)

    def enlist(self, route: Route, engine: str) -> MoveTicket:
        t = MoveTicket(route, engine)
        self._tickets[t] = None
        return t

    def withdraw(self, ticket: MoveTicket) -> None:
        self._tickets.pop(ticket, None)
        gate, ticket.gate = ticket.gate, None
        if gate is not None:
            gate.report()

    def move(self, route: Route | None = None, engine: str | None = None) -> Asked:
        """Ask every stream on ``route`` (a regime flip) or on ``engine`` (an engine drained
        with ``move``) to move to its sibling: the answering ones at once, the queued ones
        behind them (:class:`MoveGate`), the ones still before their content once it begins.
        A finished stream is not asked."""
        asked = [
            t
            for t in self._tickets
            if not t.wanted and t.phase != FINISHED and (t.route is route or t.engine == engine)
        ]
        answering = [t for t in asked if t.waiting is None and t.phase == CONTENT]
        for t in asked:
            t.wanted = True
        queued = [t for t in asked if t.waiting is not None]
        gate = MoveGate(len(answering), queued)
        if gate.holding:
            for t in answering:
                t.gate = gate
        moving = len(answering) + len(queued)
        return Asked(moving, len(asked) - moving)


@dataclass(slots=True)
class Continuation:
    """How the sibling's events are rewritten into the client's stream.

    The move happened in the answer's content phase (after any think block): a reasoning
    delta from the sibling is content the client expects (a reasoning parser that decides
    from the tokens it generated sees no ``</think>`` there and labels the whole
    continuation as reasoning), so it is delivered as ``content``."""

    id: str | None
    created: int | None
    tokens_before: int  # tokens the old engine generated (reasoning, markers and content)
    prompt_tokens: int | None = None  # the original prompt's (the engine's count), if known
    opened: bool = False  # the sibling's first choice chunk went through (its role removed)

    def apply(self, obj: dict[str, Any]) -> bool:
        """Rewrite one event object in place; False to drop it."""
        choices = obj.get("choices")
        if isinstance(choices, list) and choices:
            keep = False
            for c in choices:
                keep = _rewrite_choice(c, opening=not self.opened) or keep
            self.opened = True
            if not keep and "usage" not in obj:
                return False
        if self.id is not None and "id" in obj:
            obj["id"] = self.id
        if self.created is not None and "created" in obj:
            obj["created"] = self.created
        usage = obj.get("usage")
        if isinstance(usage, dict):
            pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
            if isinstance(pt, int) and isinstance(ct, int):
                usage["prompt_tokens"] = (
                    self.prompt_tokens if self.prompt_tokens is not None else max(0, pt - self.tokens_before)
                )
                usage["completion_tokens"] = ct + self.tokens_before
                if isinstance(usage.get("total_tokens"), int):
                    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return True


def _rewrite_choice(choice: object, *, opening: bool) -> bool:
    """Rewrite one choice of the sibling's stream in place: reasoning becomes content, the
    opening chunk's role goes (the client had its own). False when nothing is left to send
    (the opening role chunk, or a delta left empty)."""
    if not isinstance(choice, dict):
        return True
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return True  # a completion choice: its text is the answer's
    text = reasoning_of(delta)
    for k in REASONING_FIELDS:
        delta.pop(k, None)
    if text:
        content = delta.get("content")
        delta["content"] = text + (content if isinstance(content, str) else "")
    if opening:
        delta.pop("role", None)
    return (
        choice.get("finish_reason") is not None
        or choice.get("logprobs") is not None
        or any(v not in (None, "", [], {}) for v in delta.values())
    )


@dataclass(slots=True)
class SentAnswer:
    """The answer the client has been sent so far (one choice)."""

    reasoning: str
    content: str
    id: str | None
    created: int | None


def sent_answer(sent: list[bytes]) -> SentAnswer | None:
    """The reasoning and content of the events sent so far (a completion's text is content),
    with their id and created; None when they hold an error, a finish (``finish_reason`` or
    ``[DONE]``: nothing is left to continue) or anything but one choice."""
    reasoning: list[str] = []
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
            if not isinstance(c, dict) or c.get("index", 0) != 0 or c.get("finish_reason") is not None:
                return None
            delta = c.get("delta")
            if isinstance(delta, dict):
                if (r := reasoning_of(delta)) is not None:
                    reasoning.append(r)
                text = delta.get("content")
            else:
                text = c.get("text")
            if isinstance(text, str):
                parts.append(text)
    return SentAnswer("".join(reasoning), "".join(parts), rid, created)
