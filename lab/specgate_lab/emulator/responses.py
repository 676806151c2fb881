"""Answers to generation requests: one JSON body (:func:`unary_response`) or an SSE stream
(:func:`stream_response`), in vLLM's format, with usage and (optionally) per-request
speculative-decoding metrics; streams honour the mid-stream crash and hang faults.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from aiohttp import web

from specgate_lab.emulator.emulated import EmulatedEngine, cut_connection, json_response
from specgate_lab.emulator.engine import EngineRequest, TokenEvent
from specgate_lab.emulator.logprobs import ChoiceLogprobs
from specgate_lab.emulator.protocol import SSE_DONE, ParsedRequest, chunk, full_response, sse, usage
from specgate_lab.emulator.reasoning import ReasoningParser


def _spec_metrics(reqs: list[EngineRequest]) -> dict[str, Any]:
    drafts = sum(r.num_drafts for r in reqs)
    dt = sum(r.num_draft_tokens for r in reqs)
    acc = sum(r.num_accepted for r in reqs)
    k = len(reqs[0].accepted_per_pos) if reqs else 0
    return {
        "speculative_decoding": {
            "mean_acceptance_length": 1.0 + acc / drafts if drafts else 1.0,
            "draft_acceptance_rate": acc / dt if dt else 0.0,
            "num_drafts": drafts,
            "num_draft_tokens": dt,
            "num_accepted_draft_tokens": acc,
            "num_accepted_tokens_per_pos": [sum(r.accepted_per_pos[i] for r in reqs) for i in range(k)],
        }
    }


def _logprobs(pr: ParsedRequest, req: EngineRequest) -> ChoiceLogprobs:
    return ChoiceLogprobs(req, pr.logprobs or 0, chat=pr.chat, echo=pr.echo)


def parsers_for(
    h: EmulatedEngine, pr: ParsedRequest, reqs: list[EngineRequest]
) -> list[ReasoningParser] | None:
    """One reasoning parser per chat choice, when the engine runs one (vLLM parses chat
    answers only: a completion's text keeps its think markers)."""
    cfg = h.engine.config
    if not pr.chat or cfg.reasoning_parser is None:
        return None
    return [ReasoningParser(r.prompt, cfg.reasoning_parser_mode) for r in reqs]


def _prompt_total(pr: ParsedRequest) -> int:
    return sum(len(t) for t in pr.prompt_tokens) * pr.n


async def run_to_end(request: web.Request, h: EmulatedEngine, reqs: list[EngineRequest]) -> bool:
    """Submit ``reqs`` and wait until all have finished; False if the engine died first.
    Raises ConnectionResetError when the client goes away."""
    done = asyncio.Event()
    left = [len(reqs)]

    def on_event(ev: TokenEvent) -> None:
        if ev.finish_reason is not None:
            left[0] -= 1
            if left[0] == 0:
                done.set()

    for r in reqs:
        r.listener = on_event
        h.driver.submit(h.engine, r)
    while not done.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), 0.25)
        tr = request.transport
        if (tr is None or tr.is_closing()) and not done.is_set():
            raise ConnectionResetError("client disconnected")
        if h.dead:
            return False
    return True


async def unary_response(
    request: web.Request,
    h: EmulatedEngine,
    pr: ParsedRequest,
    reqs: list[EngineRequest],
    rid: str,
    created: int,
    headers: dict[str, str],
) -> web.StreamResponse:
    if not await run_to_end(request, h, reqs):
        cut_connection(request)
        return web.Response(status=503)
    echo = pr.echo and not pr.chat
    choices = [((r.prompt if echo else "") + "".join(r.output), r.finish_reason or "stop") for r in reqs]
    parsers = parsers_for(h, pr, reqs)
    reasoning: list[str] | None = None
    if parsers is not None:
        split = [p.feed(r.output) for p, r in zip(parsers, reqs, strict=True)]
        reasoning = [rs for rs, _ in split]
        choices = [(c, reason) for (_, c), (_, reason) in zip(split, choices, strict=True)]
    body = full_response(
        chat=pr.chat,
        rid=rid,
        created=created,
        model=h.name,
        choices=choices,
        prompt_tokens=_prompt_total(pr),
        completion_tokens=sum(len(r.output) for r in reqs),
        logprobs=None if pr.logprobs is None else [_logprobs(pr, r).next(r.output) for r in reqs],
        reasoning=reasoning,
        reasoning_field=h.engine.config.reasoning_field,
    )
    if h.per_request_metrics and h.engine.spec is not None:
        body["metrics"] = _spec_metrics(reqs)
    resp = json_response(body)
    resp.headers.update(headers)
    return resp


async def stream_response(
    request: web.Request,
    h: EmulatedEngine,
    pr: ParsedRequest,
    reqs: list[EngineRequest],
    rid: str,
    created: int,
    headers: dict[str, str],
    crash_after_chunks: int | None,
) -> web.StreamResponse:
    queue: asyncio.Queue[tuple[int, TokenEvent]] = asyncio.Queue()
    for i, r in enumerate(reqs):
        r.listener = lambda ev, i=i: queue.put_nowait((i, ev))
    resp = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", **headers}
    )
    await resp.prepare(request)
    for r in reqs:
        h.driver.submit(h.engine, r)
    started = [False] * len(reqs)
    lps = [_logprobs(pr, r) for r in reqs] if pr.logprobs is not None else None
    parsers = parsers_for(h, pr, reqs)
    field = h.engine.config.reasoning_field
    echo = pr.echo and not pr.chat
    left = len(reqs)
    chunks = 0
    prompt_total = _prompt_total(pr)
    model = h.name
    hang_after = h.faults.mid_stream_chunks if h.faults.hang == "mid_stream" else None
    backlog: list[tuple[int, TokenEvent]] = []  # events held back by a fault
    while left:
        items, backlog = backlog, []
        if not items:
            items.append(await queue.get())
        while not queue.empty():
            items.append(queue.get_nowait())
        parts: list[bytes] = []
        fault: str | None = None
        for n_done, (i, ev) in enumerate(items, 1):
            if pr.chat and not started[i]:
                role = chunk(
                    chat=True, rid=rid, created=created, model=model, index=i, text="", finish_reason=None
                )
                role["choices"][0]["delta"] = {"role": "assistant", "content": ""}
                parts.append(sse(role))
            text = "".join(ev.tokens)
            if echo and not started[i]:  # the prompt's text comes first, in the first chunk
                text = reqs[i].prompt + text
            started[i] = True
            thought = ""
            if parsers is not None:
                thought, text = parsers[i].feed(ev.tokens)
                if not thought and not text and ev.finish_reason is None:
                    continue  # vLLM sends no chunk for a delta that is only a think marker
            c = chunk(
                chat=pr.chat,
                rid=rid,
                created=created,
                model=model,
                index=i,
                text=text,
                finish_reason=ev.finish_reason,
                logprobs=None if lps is None else lps[i].next(ev.tokens),
            )
            if thought:
                delta = c["choices"][0]["delta"]
                delta[field] = thought
                if not text:
                    del delta["content"]
            if pr.continuous_usage and pr.include_usage:
                c["usage"] = usage(len(reqs[i].prompt_tokens), len(reqs[i].output))
            parts.append(sse(c))
            if ev.finish_reason is not None:
                left -= 1
            chunks += 1
            if crash_after_chunks is not None and chunks >= crash_after_chunks:
                fault = "crash"
            elif hang_after is not None and chunks >= hang_after:
                fault = "hang"
            if fault:
                backlog = items[n_done:]
                break
        await resp.write(b"".join(parts))
        if fault == "crash":
            await h.crash()
            return resp
        if fault == "hang":
            await h.hang_event().wait()  # until the hang fault is lifted (or the client leaves)
            hang_after = None
        if h.dead:
            cut_connection(request)
            return resp
    tail = b""
    if pr.include_usage:
        final: dict[str, Any] = {
            "id": rid,
            "object": "chat.completion.chunk" if pr.chat else "text_completion",
            "created": created,
            "model": model,
            "choices": [],
            "usage": usage(prompt_total, sum(len(r.output) for r in reqs)),
        }
        if h.per_request_metrics and h.engine.spec is not None:
            final["metrics"] = _spec_metrics(reqs)
        tail = sse(final)
    await resp.write(tail + SSE_DONE)
    await resp.write_eof()
    return resp
