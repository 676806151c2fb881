"""The emulated server's OpenAI routes: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions``,
``/tokenize`` and ``/detokenize``.

A generation request is checked against the fault knobs, parsed and validated
(:func:`specgate_lab.emulator.protocol.parse_request`), turned into one engine request per
prompt and choice, and answered by :mod:`specgate_lab.emulator.responses` (one JSON body or
an SSE stream); requests the client abandons are aborted at once.
"""

from __future__ import annotations

import contextlib
import json
import time
import zlib
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from specgate_lab.emulator.emulated import ENGINE, EmulatedEngine, cut_connection, json_response
from specgate_lab.emulator.engine import EngineRequest
from specgate_lab.emulator.errors import ApiError, error_body
from specgate_lab.emulator.protocol import (
    SPEC_UNSUPPORTED_MESSAGE,
    SSE_DONE,
    VOCAB_SIZE,
    ParsedRequest,
    check_body,
    models_body,
    new_id,
    parse_request,
    sse,
)
from specgate_lab.emulator.responses import stream_response, unary_response
from specgate_lab.emulator.template import chat_prompt, model_tokenize


def _err(e: ApiError) -> web.Response:
    return json_response(e.body(), e.status)


async def json_body(request: web.Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ApiError("request body is not valid JSON") from None


async def get_models(request: web.Request) -> web.Response:
    h = request.app[ENGINE]
    cfg = h.engine.config
    return json_response(models_body(cfg.served_model_name, cfg.model, cfg.max_model_len, h.created))


async def post_tokenize(request: web.Request) -> web.Response:
    """vLLM's ``POST /tokenize``: a completion ``prompt`` or chat ``messages`` (with
    ``add_generation_prompt`` / ``continue_final_message``) → ``count`` and ``tokens``
    (the emulator's tokens as stable ids)."""
    h = request.app[ENGINE]
    if h.dead:
        cut_connection(request)
        return web.Response(status=503)
    cfg = h.engine.config
    try:
        body = check_body(await json_body(request), cfg.served_model_name)
        if "messages" in body:
            text = chat_prompt(body)
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            raise ApiError("prompt must be a string (or give messages)", param="prompt")
    except ApiError as e:
        return _err(e)
    ids = [token_id(t) for t in model_tokenize(text)]
    return json_response(
        {"count": len(ids), "max_model_len": cfg.max_model_len, "tokens": ids, "token_strs": None}
    )


# The emulator has no fixed vocabulary: ids are given out as tokens are first seen.
_IDS: dict[str, int] = {}
_VOCAB: dict[int, str] = {}


def token_id(token: str) -> int:
    """A token's id: a hash of its text below VOCAB_SIZE (the same in every process), the
    next free id after it where another token took that one first."""
    i = _IDS.get(token)
    if i is None:
        i = zlib.crc32(token.encode()) % VOCAB_SIZE
        if len(_VOCAB) < VOCAB_SIZE:
            while i in _VOCAB:
                i = (i + 1) % VOCAB_SIZE
            _IDS[token], _VOCAB[i] = i, token
    return i


async def post_detokenize(request: web.Request) -> web.Response:
    """vLLM's ``POST /detokenize``: ``tokens`` (ids ``/tokenize`` gave out) → ``prompt``."""
    h = request.app[ENGINE]
    if h.dead:
        cut_connection(request)
        return web.Response(status=503)
    try:
        body = check_body(await json_body(request), h.engine.config.served_model_name)
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ApiError("tokens must be a list of token ids", param="tokens")
        unknown = [i for i in ids if i not in _VOCAB]
        if unknown:
            raise ApiError(f"token id {unknown[0]} is out of vocabulary", param="tokens")
    except ApiError as e:
        return _err(e)
    return json_response({"prompt": "".join(_VOCAB[i] for i in ids)})


async def post_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def post_chat(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def admit(request: web.Request, h: EmulatedEngine) -> tuple[web.StreamResponse | None, int | None]:
    """The fault knobs a generation request meets first: (the answer it gets instead, if
    any; after how many chunks its stream crashes, if it does)."""
    if h.dead:
        cut_connection(request)
        return web.Response(status=503), None
    h.requests_seen += 1
    f = h.faults
    crash_after_chunks: int | None = None
    if f.crash_after_requests is not None and h.requests_seen > f.crash_after_requests:
        if not f.crash_mid_stream:
            await h.crash()
            cut_connection(request)
            return web.Response(status=503), None
        crash_after_chunks = f.mid_stream_chunks
    if f.hang == "accept":
        await h.hang_event().wait()
    if f.error_rate and h.rng.random() < f.error_rate:
        failure = error_body("emulated engine failure (error_rate fault)", "InternalServerError", 500)
        return json_response(failure, 500), None
    return None, crash_after_chunks


async def _generate(request: web.Request, *, chat: bool) -> web.StreamResponse:
    h = request.app[ENGINE]
    instead, crash_after_chunks = await admit(request, h)
    if instead is not None:
        return instead
    cfg = h.engine.config
    try:
        body = await json_body(request)
        pr = parse_request(
            body, chat=chat, served_model_name=cfg.served_model_name, max_model_len=cfg.max_model_len
        )
    except ApiError as e:
        return _err(e)
    rid = new_id(chat)
    created = int(time.time())
    headers = {}
    if (xr := request.headers.get("X-Request-Id")) and len(xr) <= 256 and xr.isprintable():
        headers["X-Request-Id"] = xr
    if h.engine.spec is not None and pr.spec_unsupported:
        err = ApiError(SPEC_UNSUPPORTED_MESSAGE)
        if not pr.stream:
            return json_response(err.body(), 400)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **headers})
        await resp.prepare(request)
        await resp.write(sse(err.body()) + SSE_DONE)
        await resp.write_eof()
        return resp
    reqs = make_requests(h, pr, rid)
    try:
        with serving(request, h, reqs):
            if pr.stream:
                return await stream_response(request, h, pr, reqs, rid, created, headers, crash_after_chunks)
            return await unary_response(request, h, pr, reqs, rid, created, headers)
    except ConnectionResetError:
        return web.Response(status=499)  # the client went away; nobody reads this


@contextlib.contextmanager
def serving(request: web.Request, h: EmulatedEngine, reqs: list[EngineRequest]) -> Iterator[None]:
    """While ``reqs`` are answered to ``request``: the request is open on the engine (a crash
    fault cuts it), and when the answer ends, finished or not, what is still running is aborted
    (the client went away: free the slot at once)."""
    h._open[id(request)] = request
    try:
        yield
    finally:
        h._open.pop(id(request), None)
        for r in reqs:
            if r.finish_reason is None and not h.dead:
                h.driver.abort(h.engine, r)


def make_requests(h: EmulatedEngine, pr: ParsedRequest, rid: str) -> list[EngineRequest]:
    reqs = []
    cfg = h.engine.config
    for p_i, (prompt, toks) in enumerate(zip(pr.prompts, pr.prompt_tokens, strict=True)):
        max_tokens = pr.max_tokens if pr.max_tokens is not None else cfg.max_model_len - len(toks)
        for c in range(pr.n):
            seed = None if pr.seed is None else pr.seed + c
            if seed is None and pr.n > 1 and pr.temperature > 0:
                seed = h.rng.getrandbits(48)
            reqs.append(
                h.engine.make_request(
                    prompt,
                    prompt_tokens=toks,
                    max_tokens=max_tokens,
                    temperature=pr.temperature,
                    seed=seed,
                    ignore_eos=pr.ignore_eos,
                    stop=pr.stop,
                    request_id=f"{rid}-{p_i}-{c}",
                    n_param=pr.n,
                )
            )
    return reqs
