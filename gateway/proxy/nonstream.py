"""Relay a whole (non-streamed) answer from an engine to the client.

The body is read with a bound on its size and its time, its usage and per-request
metrics are harvested, and its ``model`` is renamed back to the client's name (without a
JSON round trip when the answer is not a learning sample).
"""

from __future__ import annotations

import asyncio
import json
import re

import aiohttp
from aiohttp import web

from gateway.engines.runtime import EngineRuntime
from gateway.proxy.relay import Relay
from gateway.proxy.result import ProxyResult
from gateway.proxy.sse import Harvest, Patterns, rewrite_model
from gateway.wire.errors import engine_error
from gateway.wire.headers import downstream_headers

MAX_UPSTREAM_BODY = 64 * 1024 * 1024


class BodyRelay(Relay):
    """Mixin of :class:`gateway.proxy.forward.ProxyCall`: the non-streamed half of an attempt."""

    __slots__ = ()

    async def _relay_body(
        self,
        rt: EngineRuntime,
        resp: aiohttp.ClientResponse,
        deadline: float,
        result: ProxyResult,
        *,
        total: bool = False,
    ) -> None:
        with self._upstream_read(
            rt,
            result,
            timeout_error="first_byte_timeout",
            timeout_message=f"engine {rt.name} did not finish in time",
            what="response",
            total=total,
        ):
            if resp.content.is_eof():  # the whole body came with the headers: no timer needed
                data = await _read_body(resp.content)
            else:
                async with asyncio.timeout_at(deadline):
                    data = await _read_body(resp.content)
        if len(data) > MAX_UPSTREAM_BODY:
            raise self._fail(
                rt, "too_large", 502, f"engine {rt.name} sent an oversized response", result.reason
            )
        headers = self._client_headers(rt, result.reason)
        headers.update(downstream_headers(resp.headers))
        ctype = resp.headers.get("Content-Type", "application/json")
        is_json = ctype.startswith("application/json")
        fast = _fast_body(data, result.harvest, self._patterns(rt), resp.status == 200) if is_json else None
        if fast is not None:
            data = fast
        elif is_json:
            try:
                obj = json.loads(data)
            except ValueError:
                obj = None
            if isinstance(obj, dict):
                result.harvest.take(obj)
                if resp.status == 200:
                    data = rewrite_model(data, self._patterns(rt), obj, self.client_model)
                elif (err := engine_error(obj, resp.status)) is not None:
                    data = json.dumps(err).encode()  # the gateway's one error shape
        headers["Content-Type"] = ctype
        result.response = web.Response(status=resp.status, body=data, headers=headers)
        result.status = resp.status
        result.ok = resp.status == 200 and result.harvest.error is None
        if resp.status != 200:
            result.error = f"status_{resp.status}"


async def _read_body(content: aiohttp.StreamReader) -> bytes:
    """The body, up to one byte past MAX_UPSTREAM_BODY (so an oversized one is detected)."""
    data = await content.read(MAX_UPSTREAM_BODY + 1)
    while len(data) <= MAX_UPSTREAM_BODY and not content.at_eof():
        more = await content.read(MAX_UPSTREAM_BODY + 1 - len(data))
        if not more:
            break
        data += more
    return data


_USAGE_RE = re.compile(rb'"(prompt_tokens|completion_tokens)":\s*(\d+)')


def _fast_body(data: bytes, h: Harvest, patterns: Patterns, rename: bool) -> bytes | None:
    """A non-streaming answer that is not a learning sample: read the usage and rename the
    model without a JSON round trip. None (the caller parses) for errors, per-request
    metrics, or when the model field is not where engines' JSON encoders put it."""
    if h.collect_text or b'"error"' in data or b'"metrics"' in data or not data.startswith(b"{"):
        return None
    for old, new in patterns:  # noqa: B007 - the match is used after the loop
        if old in data:
            break
    else:
        return None
    usage = data.rfind(b'"usage"')
    if usage < 0:
        return None
    for key, value in _USAGE_RE.findall(data, usage):
        if key == b"prompt_tokens":
            h.prompt_tokens = int(value)
        else:
            h.completion_tokens = int(value)
    return data.replace(old, new, 1) if rename else data
