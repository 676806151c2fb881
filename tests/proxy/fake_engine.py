"""A small, controllable OpenAI-speaking upstream for precise wire tests.

Each :class:`FakeEngine` is an aiohttp app (run it in a ``TestServer``) that records
every request and behaves as its fields say: answer, stream with a gate after the
first event, fail with a status, hang, or die mid-stream. Events let tests wait for
exactly the moment they care about (first event sent, request seen, abort seen).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from tests.proxy.fake_responses import response_events, response_object


@dataclass
class Seen:
    path: str
    headers: CIMultiDict[str]
    body: dict[str, Any]


@dataclass
class FakeEngine:
    served: str
    tokens: list[str] = field(default_factory=lambda: ["Hello", ",", " world", "!"])
    status: int = 200
    error_body: bytes | None = None
    hang_before_headers: bool = False
    hang_after_headers: bool = False  # stream: headers sent, then silence
    gate: asyncio.Event | None = None  # stream: wait for it after the first event
    die_after_first: bool = False  # stream: drop the connection after the first event
    send_error_event: bool = False  # stream: vLLM-style error event then [DONE]
    spec_metrics: dict[str, float] | None = None
    model_in_reply: str | None = None  # default: the served name
    requests: list[Seen] = field(default_factory=list)
    received: asyncio.Event = field(default_factory=asyncio.Event)
    first_sent: asyncio.Event = field(default_factory=asyncio.Event)
    aborted: asyncio.Event = field(default_factory=asyncio.Event)
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    health_status: int = 200
    response_headers: dict[str, str] = field(default_factory=dict)  # added to non-stream answers
    raw_stream: list[bytes] | None = None  # stream: write exactly these pieces (any framing)
    spaced_json: bool = False  # json.dumps default separators ('"model": "x"')
    # A reasoning model (chat): these tokens stream first as ``reasoning_field`` deltas, then
    # ``tokens`` as content; the answer generated is ``<think>`` + reasoning + ``</think>`` +
    # content, so usage counts len(reasoning) + 2 + len(tokens). A request continuing a final
    # assistant message (``continue_final_message``) gets the rest of that answer, labelled
    # content, or reasoning when ``continuation_as_reasoning`` (an older parser that sees no
    # ``</think>`` in its own output).
    reasoning: list[str] = field(default_factory=list)
    reasoning_field: str = "reasoning_content"
    continuation_as_reasoning: bool = False
    pause_at: int = 0  # stream: the event after which ``gate`` is awaited
    paused: asyncio.Event = field(default_factory=asyncio.Event)  # set when the gate is reached
    hold_after: int | None = None  # stream: the event after which ``hold`` is awaited
    hold: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/detokenize", self._tokenize)
        app.router.add_get("/health", self._health)
        return app

    PROMPT_TOKENS = 7  # every prompt, whatever its text (plus a continued answer's tokens)

    def _answer_tokens(self, text: str) -> int:
        """Tokens of an answer so far given back as a final assistant message: its think
        block (markers and reasoning tokens, newlines at the edges stripped as Qwen3's
        template does) and its content tokens."""
        n = 0
        if "</think>" in text:
            head, text = text.split("</think>", 1)
            n = 2 + _prefix_tokens(self.reasoning, head.split("<think>")[-1].strip("\n"))
            text = text.lstrip("\n")
        return n + _prefix_tokens(self.tokens, text)

    def _prompt_tokens(self, body: dict[str, Any]) -> tuple[int, int]:
        """(prompt tokens, tokens of the answer it continues)."""
        msgs = body.get("messages") or []
        if body.get("continue_final_message") and msgs and msgs[-1].get("role") == "assistant":
            done = self._answer_tokens(msgs[-1].get("content") or "")
            return self.PROMPT_TOKENS + done, done
        return self.PROMPT_TOKENS, 0

    def _reasoning_count(self, body: dict[str, Any]) -> int:
        """A reasoning fake's ``/tokenize``: its prompts count :data:`PROMPT_TOKENS` (as its
        usage does), a text the tokens of its answer that it is the start of."""
        if isinstance(body.get("prompt"), str):
            return self._answer_tokens(body["prompt"])
        return self._prompt_tokens(body)[0]

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=self.health_status)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    def _chunk(
        self, body: dict[str, Any], chat: bool, text: str | None, finish: str | None, field: str = "content"
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": None}
        if chat:
            choice["delta"] = {field: text} if text is not None else {"role": "assistant", "content": ""}
        else:
            choice["text"] = text or ""
        return {
            "id": "cmpl-fake",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": self.model_in_reply or body.get("model"),
            "choices": [choice],
        }

    async def _tokenize(self, request: web.Request) -> web.Response:
        """vLLM's tokenizer endpoints, one token per word (ids are word indexes); a reasoning
        fake counts as :meth:`_reasoning_count` says."""
        body = await request.json()
        self.requests.append(Seen(request.path, CIMultiDict(request.headers), body))
        if self.status != 200:
            err = {"error": {"message": "engine says no", "type": "BadRequestError", "code": self.status}}
            return web.json_response(err, status=self.status)
        if request.path == "/detokenize":
            return web.json_response({"prompt": " ".join(f"w{t}" for t in body["tokens"])})
        if self.reasoning:
            n = self._reasoning_count(body)
        else:
            n = len(body.get("prompt", "").split()) + len(body.get("messages", []))
        answer = {"count": n, "max_model_len": 4096, "tokens": list(range(n)), "token_strs": None}
        return web.json_response(answer)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(Seen(request.path, CIMultiDict(request.headers), body))
        self.received.set()
        model = self.model_in_reply or body.get("model")
        if self.status != 200:
            err = {"error": {"message": "engine says no", "type": "BadRequestError", "code": self.status}}
            return web.json_response(err, status=self.status)
        if not body.get("stream"):
            self.finished.set()
            return web.json_response(response_object(body, "".join(self.tokens), "completed", model))
        resp = web.StreamResponse()
        resp.content_type = "text/event-stream"
        await resp.prepare(request)
        for i, ev in enumerate(response_events(body, self.tokens, model)):
            await resp.write(ev)
            if i == 0:
                self.first_sent.set()
                if self.gate is not None:
                    await self.gate.wait()
                if self.die_after_first and request.transport is not None:
                    request.transport.close()
                    return resp
        await resp.write_eof()
        self.finished.set()
        return resp

    async def _serve(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(Seen(request.path, CIMultiDict(request.headers), body))
        self.received.set()
        try:
            if self.hang_before_headers:
                await asyncio.Event().wait()
            if self.status != 200:
                err = (
                    self.error_body
                    or json.dumps(
                        {
                            "error": {
                                "message": "engine says no",
                                "type": "BadRequestError",
                                "code": self.status,
                            }
                        }
                    ).encode()
                )
                return web.Response(status=self.status, body=err, content_type="application/json")
            prompt_n, done = self._prompt_tokens(body)
            steps: list[tuple[str, str]] = [("content", t) for t in self.tokens]
            if self.reasoning and chat:
                steps = [(self.reasoning_field, t) for t in self.reasoning] + steps
            generated = len(steps) + (2 if self.reasoning and chat else 0)
            if done:  # a continuation: the rest of the answer (its think block was given)
                steps = steps[done - (2 if self.reasoning else 0) :]
                label = self.reasoning_field if self.continuation_as_reasoning else "content"
                steps = [(label, t) for _, t in steps]
                generated -= done
            usage = {
                "prompt_tokens": prompt_n,
                "completion_tokens": generated,
                "total_tokens": prompt_n + generated,
            }
            if not body.get("stream"):
                text = "".join(self.tokens)
                choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
                if chat:
                    choice["message"] = {"role": "assistant", "content": text}
                else:
                    choice["text"] = text
                reply: dict[str, Any] = {
                    "id": "cmpl-fake",
                    "object": "chat.completion" if chat else "text_completion",
                    "created": int(time.time()),
                    "model": self.model_in_reply or body.get("model"),
                    "choices": [choice],
                    "usage": usage,
                }
                if self.spec_metrics:
                    reply["metrics"] = {"speculative_decoding": self.spec_metrics}
                self.finished.set()
                return web.json_response(reply, headers=self.response_headers)
            resp = web.StreamResponse()
            resp.content_type = "text/event-stream"
            await resp.prepare(request)
            if self.hang_after_headers:
                await asyncio.Event().wait()
            if self.raw_stream is not None:
                for piece in self.raw_stream:
                    await resp.write(piece)
                    await asyncio.sleep(0)
                await resp.write_eof()
                self.finished.set()
                return resp
            if self.send_error_event:
                err_ev = {
                    "error": {"message": "min_p is not supported", "type": "BadRequestError", "code": 400}
                }
                await resp.write(b"data: " + json.dumps(err_ev).encode() + b"\n\n")
                await resp.write(b"data: [DONE]\n\n")
                await resp.write_eof()
                return resp
            last = len(steps) - 1
            # Made one by one, the loop yielding now and then: a long answer (the tests' 20000
            # events) built or written in one step would hold the event loop for its CPU.
            events = itertools.chain(
                [self._chunk(body, chat, None, None)] if chat else [],
                (
                    self._chunk(body, chat, tok, "stop" if i == last else None, label)
                    for i, (label, tok) in enumerate(steps)
                ),
            )
            for i, ev in enumerate(events):
                seps = (", ", ": ") if self.spaced_json else (",", ":")
                await resp.write(b"data: " + json.dumps(ev, separators=seps).encode() + b"\n\n")
                if i % 256 == 255:
                    await asyncio.sleep(0)
                if i == 0:
                    self.first_sent.set()
                if i == self.pause_at:
                    self.paused.set()
                    if self.gate is not None:
                        await self.gate.wait()
                if i == self.hold_after:
                    await self.hold.wait()
                if i == 0 and self.die_after_first:
                    assert request.transport is not None
                    request.transport.close()
                    return resp
            opts = body.get("stream_options") or {}
            if opts.get("include_usage"):
                final: dict[str, Any] = {
                    "id": "cmpl-fake",
                    "object": "chat.completion.chunk",
                    "created": int(time.time()),
                    "model": body.get("model"),
                    "choices": [],
                    "usage": usage,
                }
                if self.spec_metrics:
                    final["metrics"] = {"speculative_decoding": self.spec_metrics}
                await resp.write(b"data: " + json.dumps(final).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            self.finished.set()
            return resp
        except (asyncio.CancelledError, ConnectionResetError):
            self.aborted.set()
            raise


def _prefix_tokens(tokens: list[str], text: str) -> int:
    """How many of ``tokens`` make up ``text`` (a prefix of their concatenation)."""
    got, n = "", 0
    while got != text and n < len(tokens) and len(got) < len(text):
        got += tokens[n]
        n += 1
    assert got == text, f"not a prefix of the fake's answer: {text!r}"
    return n
