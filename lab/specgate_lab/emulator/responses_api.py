"""``POST /v1/responses`` (the OpenAI Responses API) as vLLM serves it.

The request's ``input`` (a string, or a list of message items, with reasoning items given
back) and ``instructions`` become chat messages, rendered by the chat template and run as
one chat request (``max_output_tokens`` bounds every generated token); the answer comes
back as a ``response`` object whose ``output`` holds a reasoning item (when the engine
runs a reasoning parser) and the message, with ``usage`` (``input_tokens``,
``output_tokens``, ``output_tokens_details.reasoning_tokens``), or as typed SSE events
(``response.created`` … ``response.completed``, each with its ``sequence_number``).

``store`` is on by default as in vLLM, which keeps no responses unless started with
``VLLM_ENABLE_RESPONSES_API_STORE``: like it, the emulator quietly answers without
storing, refuses ``background`` (which needs the store), and finds no response by id
(``previous_response_id``, ``GET /v1/responses/{id}``).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web

from specgate_lab.emulator.emulated import ENGINE, EmulatedEngine, cut_connection, json_response
from specgate_lab.emulator.engine import EngineRequest, TokenEvent
from specgate_lab.emulator.errors import ApiError
from specgate_lab.emulator.openai_routes import admit, json_body, make_requests, serving
from specgate_lab.emulator.protocol import ParsedRequest, parse_request, sse
from specgate_lab.emulator.reasoning import ReasoningParser
from specgate_lab.emulator.responses import parsers_for, run_to_end

NO_STORE = (
    "This vLLM engine does not support `store=True` and therefore does not support the background "
    "mode. To enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` "
    "when launching the vLLM server."
)


def _not_found(response_id: str) -> ApiError:
    return ApiError(f"Response with id '{response_id}' not found.", status=404, type_="invalid_request_error")


def _item_text(item: dict[str, Any], i: int) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and isinstance(p.get("text"), str) for p in content
    ):
        return "".join(p["text"] for p in content)
    raise ApiError(f"input[{i}].content must be a string or a list of text parts", param="input")


def messages_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat messages a Responses request stands for."""
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ApiError("instructions must be a string", param="instructions")
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    raw = body.get("input")
    if isinstance(raw, str):
        return [*messages, {"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise ApiError("input must be a string or a non-empty list of items", param="input")
    reasoning: str | None = None
    for i, item in enumerate(raw):
        if not isinstance(item, dict):
            raise ApiError(f"input[{i}] must be an object", param="input")
        kind = item.get("type", "message")
        if kind == "reasoning":  # given back: it goes with the assistant message after it
            reasoning = _item_text(item, i)
        elif kind == "message" and item.get("role") in ("user", "system", "developer", "assistant"):
            m = {"role": item["role"], "content": _item_text(item, i)}
            if item["role"] == "assistant" and reasoning is not None:
                m["reasoning"], reasoning = reasoning, None
            messages.append(m)
        else:
            raise ApiError(f"input[{i}]: unsupported item type {kind!r}", param="input")
    return messages


def _chat_body(body: dict[str, Any]) -> dict[str, Any]:
    chat: dict[str, Any] = {k: body[k] for k in ("model", "temperature", "top_p", "stream") if k in body}
    chat["messages"] = messages_of(body)
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    return chat


class _Response:
    """One response's identity and the object its events carry."""

    def __init__(self, h: EmulatedEngine, body: dict[str, Any], pr: ParsedRequest) -> None:
        self.id = "resp_" + uuid.uuid4().hex
        self.created = int(time.time())
        self.model = h.name
        self.body, self.pr = body, pr
        self.seq = 0

    def obj(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
        pr, body = self.pr, self.body
        return {
            "id": self.id,
            "created_at": self.created,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.get("instructions"),
            "metadata": body.get("metadata"),
            "model": self.model,
            "object": "response",
            "output": output,
            "parallel_tool_calls": True,
            "temperature": pr.temperature,
            "tool_choice": "auto",
            "tools": [],
            "top_p": body.get("top_p", 1.0),
            "background": False,
            "max_output_tokens": pr.max_tokens,
            "max_tool_calls": None,
            "previous_response_id": None,
            "prompt": None,
            "reasoning": None,
            "service_tier": "auto",
            "status": status,
            "text": None,
            "top_logprobs": None,
            "truncation": "disabled",
            "usage": usage,
            "user": None,
        }

    def event(self, type_: str, **fields: Any) -> bytes:
        out = sse({"type": type_, "sequence_number": self.seq, **fields})
        self.seq += 1
        return out


def _usage(pr: ParsedRequest, req: EngineRequest, reasoning_tokens: int) -> dict[str, Any]:
    prompt = len(pr.prompt_tokens[0])
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": len(req.output),
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": prompt + len(req.output),
    }


def _reasoning_item(rid: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {
        "id": rid,
        "type": "reasoning",
        "summary": [],
        "content": content,
        "encrypted_content": None,
        "status": status,
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(mid: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [_text_part(text)]
    return {"id": mid, "type": "message", "role": "assistant", "status": status, "content": content}


def _status(req: EngineRequest) -> str:
    return "incomplete" if req.finish_reason == "length" else "completed"


async def post_responses(request: web.Request) -> web.StreamResponse:
    h = request.app[ENGINE]
    instead, crash_after_chunks = await admit(request, h)
    if instead is not None:
        return instead
    cfg = h.engine.config
    try:
        body = await json_body(request)
        if not isinstance(body, dict):
            raise ApiError("request body must be a JSON object")
        for key in ("store", "background"):
            if body.get(key) is not None and not isinstance(body[key], bool):
                raise ApiError(f"{key} must be a boolean", param=key)
        if body.get("metadata") is not None and not isinstance(body["metadata"], dict):
            raise ApiError("metadata must be an object", param="metadata")
        if body.get("background") is True:
            raise ApiError(NO_STORE, type_="invalid_request_error")
        if (prev := body.get("previous_response_id")) is not None:
            raise _not_found(str(prev))
        pr = parse_request(
            _chat_body(body),
            chat=True,
            served_model_name=cfg.served_model_name,
            max_model_len=cfg.max_model_len,
        )
    except ApiError as e:
        return json_response(e.body(), e.status)
    resp = _Response(h, body, pr)
    (req,) = make_requests(h, pr, resp.id)
    parsers = parsers_for(h, pr, [req])
    parser = parsers[0] if parsers else None
    try:
        with serving(request, h, [req]):
            if pr.stream:
                return await _stream(request, h, resp, req, parser, crash_after_chunks)
            return await _unary(request, h, resp, pr, req, parser)
    except ConnectionResetError:
        return web.Response(status=499)


async def _unary(
    request: web.Request,
    h: EmulatedEngine,
    resp: _Response,
    pr: ParsedRequest,
    req: EngineRequest,
    parser: ReasoningParser | None,
) -> web.StreamResponse:
    if not await run_to_end(request, h, [req]):
        cut_connection(request)
        return web.Response(status=503)
    reasoning, content = parser.feed(req.output) if parser is not None else ("", "".join(req.output))
    output = []
    if parser is not None and reasoning:
        output.append(_reasoning_item("rs_" + uuid.uuid4().hex, reasoning, "completed"))
    if content or parser is None:
        output.append(_message_item("msg_" + uuid.uuid4().hex, content, "completed"))
    rt = parser.reasoning_tokens if parser is not None else 0
    return json_response(resp.obj(_status(req), output, _usage(pr, req, rt)))


async def get_response(request: web.Request) -> web.Response:
    """Nothing is stored (see the module docstring): every id is unknown."""
    return json_response(_not_found(request.match_info["response_id"]).body(), 404)


class _Items:
    """The output items of a streamed response, opened and closed as text arrives."""

    def __init__(self, resp: _Response) -> None:
        self.resp = resp
        self.done: list[dict[str, Any]] = []
        self.open: tuple[str, str, list[str]] | None = None  # kind, id, text so far

    def add(self, kind: str, text: str) -> bytes:
        out = b""
        if self.open is not None and self.open[0] != kind:
            out += self.close()
        ev = self.resp.event
        if self.open is None:
            iid = ("rs_" if kind == "reasoning" else "msg_") + uuid.uuid4().hex
            self.open = (kind, iid, [])
            idx = len(self.done)
            if kind == "reasoning":
                out += ev(
                    "response.output_item.added",
                    output_index=idx,
                    item=_reasoning_item(iid, None, "in_progress"),
                )
                part = {"type": "reasoning_text", "text": ""}
            else:
                out += ev(
                    "response.output_item.added",
                    output_index=idx,
                    item=_message_item(iid, None, "in_progress"),
                )
                part = _text_part("")
            out += ev(
                "response.content_part.added", item_id=iid, output_index=idx, content_index=0, part=part
            )
        kind, iid, texts = self.open
        texts.append(text)
        delta = "response.reasoning_text.delta" if kind == "reasoning" else "response.output_text.delta"
        extra: dict[str, Any] = {} if kind == "reasoning" else {"logprobs": []}
        return out + ev(delta, item_id=iid, output_index=len(self.done), content_index=0, delta=text, **extra)

    def close(self) -> bytes:
        if self.open is None:
            return b""
        kind, iid, texts = self.open
        self.open = None
        text, idx, ev = "".join(texts), len(self.done), self.resp.event
        where = {"item_id": iid, "output_index": idx, "content_index": 0}
        if kind == "reasoning":
            out = ev("response.reasoning_text.done", **where, text=text)
            part, item = {"type": "reasoning_text", "text": text}, _reasoning_item(iid, text, "completed")
        else:
            out = ev("response.output_text.done", **where, text=text, logprobs=[])
            part, item = _text_part(text), _message_item(iid, text, "completed")
        out += ev("response.content_part.done", **where, part=part)
        out += ev("response.output_item.done", output_index=idx, item=item)
        self.done.append(item)
        return out


async def _stream(
    request: web.Request,
    h: EmulatedEngine,
    resp: _Response,
    req: EngineRequest,
    parser: ReasoningParser | None,
    crash_after_chunks: int | None,
) -> web.StreamResponse:
    queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
    req.listener = queue.put_nowait
    out = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await out.prepare(request)
    await out.write(
        resp.event("response.created", response=resp.obj("in_progress", [], None))
        + resp.event("response.in_progress", response=resp.obj("in_progress", [], None))
    )
    h.driver.submit(h.engine, req)
    items = _Items(resp)
    split: Callable[[list[str]], tuple[str, str]] = (
        parser.feed if parser is not None else (lambda toks: ("", "".join(toks)))
    )
    chunks = 0
    hang_after = h.faults.mid_stream_chunks if h.faults.hang == "mid_stream" else None
    while True:
        ev = await queue.get()
        reasoning, content = split(ev.tokens)
        data = (items.add("reasoning", reasoning) if reasoning else b"") + (
            items.add("message", content) if content else b""
        )
        if data:
            await out.write(data)
            chunks += 1
        if crash_after_chunks is not None and chunks >= crash_after_chunks:
            await h.crash()
            return out
        if hang_after is not None and chunks >= hang_after:
            await h.hang_event().wait()  # until the hang fault is lifted (or the client leaves)
            hang_after = None
        if h.dead:
            cut_connection(request)
            return out
        if ev.finish_reason is not None:
            break
    tail = items.close()
    rt = parser.reasoning_tokens if parser is not None else 0
    final = resp.obj(_status(req), items.done, _usage(resp.pr, req, rt))
    await out.write(tail + resp.event("response.completed", response=final))
    await out.write_eof()
    return out
