"""``POST /tokenize`` and ``POST /detokenize``: vLLM's tokenizer endpoints, passed through.

Both engines of a model serve the same weights and tokenizer, so the answer does not
depend on the engine: the request goes to the least-busy healthy engine of the model (no
routing decision, no failover). The body is read and bounded like any request body,
checked for the fields the gateway relies on (``model``; ``prompt`` or ``messages`` to
tokenize, ``tokens`` to detokenize), the model renamed to the engine's served name; the
engine's answer is relayed as it came (its errors in the gateway's OpenAI shape).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from gateway.api.body import parse_body
from gateway.api.completions import admit_model, authenticate, overloaded, read_body
from gateway.api.features import model_name
from gateway.api.state import STATE, rid_of
from gateway.engines.runtime import EngineRuntime, ModelRuntime
from gateway.proxy.body import splice_model
from gateway.proxy.relay import client_timeout, engine_headers
from gateway.wire.errors import ApiError, engine_error, error_response
from gateway.wire.headers import ENGINE, REQUEST_ID

MAX_ANSWER = 16 * 1024 * 1024  # a tokenized prompt of max_body_bytes, as JSON numbers


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"'{param}' {message}", param=param, code="invalid_value")


def _check_tokenize(body: dict[str, Any]) -> None:
    prompt, messages = body.get("prompt"), body.get("messages")
    if (prompt is None) == (messages is None):
        raise _bad("prompt", "or 'messages' is required (exactly one of them)")
    if prompt is not None and not isinstance(prompt, str):
        raise _bad("prompt", "must be a string")
    if messages is not None and (not isinstance(messages, list) or not messages):
        raise _bad("messages", "must be a non-empty array")
    for key in ("add_special_tokens", "add_generation_prompt", "return_token_strs"):
        if body.get(key) is not None and not isinstance(body[key], bool):
            raise _bad(key, "must be a boolean")


def _check_detokenize(body: dict[str, Any]) -> None:
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 1 << 31 for t in tokens
    ):
        raise _bad("tokens", "is required: an array of token ids")


async def tokenize(request: web.Request) -> web.Response:
    """vLLM's ``POST /tokenize`` (``prompt`` or chat ``messages``) on an engine of the model."""
    return await _pass_through(request, "/tokenize", _check_tokenize)


async def detokenize(request: web.Request) -> web.Response:
    """vLLM's ``POST /detokenize`` (``tokens``) on an engine of the model."""
    return await _pass_through(request, "/detokenize", _check_detokenize)


def pick_engine(mrt: ModelRuntime, now: float) -> EngineRuntime:
    """The least-busy engine of the model that is healthy and not draining (503 if none)."""
    usable = [rt for rt in mrt.engines.values() if not rt.draining and rt.healthy(now)]
    if not usable:
        raise ApiError(
            503,
            f"no engine can serve model '{mrt.config.name}' right now",
            code="no_engine_available",
            headers={"Retry-After": "1"},
        )
    return min(usable, key=lambda rt: rt.inflight)


async def _pass_through(
    request: web.Request, path: str, check: Callable[[dict[str, Any]], None]
) -> web.Response:
    st = request.app[STATE]
    rid = rid_of(request)
    headers = {REQUEST_ID: rid}
    try:
        refusal = overloaded(st)
        if refusal is not None:
            raise refusal.error
        authenticate(st, request)
        server = st.config.server
        raw = await read_body(request, server.max_body_bytes)
        body = await parse_body(raw, server)
        name = model_name(body)
        mrt = admit_model(st, request, name)
        check(body)
        rt = pick_engine(mrt, time.monotonic())
        headers[ENGINE] = rt.name
        upstream = engine_headers(request.headers, st.forward_headers, rid, rt)
        served = rt.config.served_model_name
        payload = splice_model(raw, name, served, add_usage=False)
        if payload is None:
            payload = json.dumps({**body, "model": served}, ensure_ascii=False).encode()
        t = mrt.config.timeouts
        async with asyncio.timeout(t.first_byte_s):
            status, data = await _post(st.pool.session(rt.name), rt, path, payload, upstream, t.connect_s)
        return _answer(rt, status, data, headers)
    except TimeoutError:
        late = ApiError(504, f"engine {headers.get(ENGINE)} did not answer in time", code="upstream_timeout")
        return error_response(late, headers)
    except ApiError as exc:
        return error_response(exc, headers)


async def _post(
    session: aiohttp.ClientSession,
    rt: EngineRuntime,
    path: str,
    payload: bytes,
    headers: CIMultiDict[str],
    connect_s: float,
) -> tuple[int, bytes]:
    try:
        async with session.post(
            rt.config.url + path, data=payload, headers=headers, timeout=client_timeout(connect_s)
        ) as resp:
            return resp.status, await resp.content.read(MAX_ANSWER + 1)
    except (aiohttp.ClientError, OSError) as exc:
        raise ApiError(
            502, f"engine {rt.name} is unreachable ({type(exc).__name__})", code="upstream_error"
        ) from None


def _answer(rt: EngineRuntime, status: int, data: bytes, headers: dict[str, str]) -> web.Response:
    """The engine's answer as it came; an error in the gateway's shape; 502 for anything else."""
    try:
        obj = json.loads(data) if len(data) <= MAX_ANSWER else None
    except ValueError:
        obj = None
    err = engine_error(obj, status) if isinstance(obj, dict) and status != 200 else None
    if status == 200 and isinstance(obj, dict):
        return web.Response(body=data, content_type="application/json", headers=headers)
    if err is None:
        raise ApiError(502, f"engine {rt.name} answered HTTP {status} unreadably", code="upstream_error")
    return web.Response(
        status=status, body=json.dumps(err).encode(), content_type="application/json", headers=headers
    )
