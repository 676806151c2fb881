"""End to end through real Envoy: the OpenAI SDK → Envoy → (ext_proc) specgate → the engine it picked.

Envoy 1.40 runs the bootstrap ``specgate envoy-config`` writes; specgate serves the EPP
beside its HTTP port; the engines are an emulated pair. The engine that answered shows in
the answer's ``model`` (``qwen3-8b-spec`` / ``qwen3-8b-base``) where the pair serves two
names, and in the emulator's own request count where it serves one.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from gateway.api.app import build_app
from gateway.api.epp import extproc
from gateway.api.epp.server import EPP
from gateway.api.state import STATE
from gateway.config import GatewayConfig
from gateway.envoy.bootstrap import envoy_config
from specgate_lab.emulator.launch import EmulatorGroup, RunningEngine
from tests.conftest import gateway_config_for
from tests.epp.envoy_proc import Envoy, http_filter, needs_envoy, run_envoy

pytestmark = needs_envoy

MESSAGES = [{"role": "user", "content": "Repeat after me: the quick brown fox jumps over the lazy dog"}]


@asynccontextmanager
async def stack(
    config: GatewayConfig,
    tmp_path: Path,
    edit: Callable[[dict[str, Any]], dict[str, Any]] = lambda boot: boot,
    **envoy_kw: Any,
) -> AsyncIterator[tuple[Envoy, Any]]:
    """specgate (HTTP + EPP on free ports) and Envoy in front of it, on the bootstrap
    ``specgate envoy-config`` writes (changed by ``edit``)."""
    app = build_app(config)
    server = TestServer(app)
    await server.start_server()
    try:
        boot = envoy_config(
            config, listen_port=0, admin_port=0, epp_port=envoy_kw.pop("epp_port", app[EPP].port), **envoy_kw
        )
        async with run_envoy(edit(boot), tmp_path) as envoy:
            yield envoy, app
    finally:
        await server.close()


async def client(envoy: Envoy) -> openai.AsyncOpenAI:
    # Built off the loop: the SDK loads its TLS trust store when it is created.
    return await asyncio.to_thread(
        openai.AsyncOpenAI, base_url=f"{envoy.url}/v1", api_key="none", max_retries=0, timeout=30
    )


async def served(engine: RunningEngine) -> int:
    """Requests the emulated engine finished (its ``vllm:request_success_total``)."""
    async with aiohttp.ClientSession() as s, s.get(f"{engine.url}/metrics") as r:
        text = await r.text()
    return int(
        sum(
            x.value
            for fam in text_string_to_metric_families(text)
            if fam.name == "vllm:request_success"
            for x in fam.samples
            if x.name.endswith("_total")
        )
    )


def epp_config(group: EmulatorGroup, **overrides: Any) -> GatewayConfig:
    return gateway_config_for(group, **{"epp.enabled": True, "epp.port": 0, **overrides})


@dataclass
class Phases:
    """What Envoy showed the EPP, per ext_proc stream of an inference request."""

    deferred: list[bool] = field(default_factory=list)  # the body came without waiting
    responses: int = 0  # response phases (headers) that reached the EPP
    finished: list[tuple[int, str | None]] = field(default_factory=list)  # (status, error) counted
    messages: list[bytes] = field(default_factory=list)  # every ProcessingRequest, as Envoy sent it


def phases(app: Any) -> Phases:
    """Count, from now on, how each request's body came, which responses reached the EPP and
    the status each request was counted with."""
    seen = Phases()
    streams = app[EPP].open_stream

    def counting(stream: Any) -> Any:
        handler = streams(stream)
        if isinstance(handler, extproc.ExtProcStream):
            request, response = handler._request_headers, handler._response_headers

            def request_headers(inc: Any) -> None:
                request(inc)
                seen.deferred.append(handler.deferred)

            def response_headers(inc: Any) -> None:
                seen.responses += 1
                response(inc)

            def finished(p: Any, status: int, pt: Any, ct: Any, error: str | None, **kw: Any) -> None:
                seen.finished.append((status, error))
                fin(p, status, pt, ct, error, **kw)

            def on_message(message: bytes) -> None:
                seen.messages.append(message)
                receive(message)

            fin, receive = handler._finished, handler.on_message
            handler._finished = finished  # type: ignore[method-assign]
            handler.on_message = on_message  # type: ignore[method-assign]
            handler._request_headers = request_headers  # type: ignore[method-assign]
            handler._response_headers = response_headers  # type: ignore[method-assign]
        return handler

    app[EPP].open_stream = counting
    return seen


@pytest.mark.parametrize("watched", [True, False], ids=["watched", "unwatched"])
async def test_the_sdk_gets_answers_from_the_engine_the_epp_chose(
    pair: EmulatorGroup, tmp_path: Path, watched: bool
) -> None:
    """Watched answers (the EPP asks for their response headers) and unwatched ones (Envoy
    adds the route headers from the EPP's metadata) alike."""
    cfg = epp_config(pair, **({} if watched else {"epp.observe_per_s": 0}))
    async with stack(cfg, tmp_path) as (envoy, app):
        seen = phases(app)
        c = await client(envoy)
        try:
            for route in ("spec", "base", "auto"):
                raw = await c.chat.completions.with_raw_response.create(
                    model="qwen3-8b",
                    messages=MESSAGES,
                    max_tokens=12,
                    temperature=0,
                    extra_headers={"x-specgate-route": route},
                )
                answer = raw.parse()
                picked = raw.headers["x-specgate-route"]
                assert answer.model == f"qwen3-8b-{picked}"  # the engine that answered
                assert raw.headers["x-specgate-engine"] == f"{picked}0"
                assert raw.headers["x-request-id"]
                if route != "auto":
                    assert picked == route and raw.headers["x-specgate-reason"] == "forced"
                assert answer.usage is not None and answer.usage.completion_tokens == 12
            # A stream, relayed by Envoy chunk by chunk.
            stream = await c.chat.completions.create(
                model="qwen3-8b",
                messages=MESSAGES,
                max_tokens=16,
                temperature=0,
                stream=True,
                extra_headers={"x-specgate-route": "spec"},
            )
            chunks = [ch async for ch in stream]
            assert {ch.model for ch in chunks} == {"qwen3-8b-spec"}
            assert sum(1 for ch in chunks if ch.choices and ch.choices[0].delta.content) >= 2
        finally:
            await c.close()
        st = app[STATE]
        # The client has the answer's last byte before Envoy ends the ext_proc stream that
        # holds its slot: on a busy machine that end is read a moment later.
        assert await st.drain(10.0)
        assert all(e.inflight == 0 for e in st.engines)
        totals = {e.name: e.total_requests for e in st.engines}
        assert totals["spec0"] >= 2 and totals["base0"] >= 1
        assert seen.responses == (4 if watched else 0)  # the response phases Envoy sent the EPP
        # Only the headers specgate reads leave Envoy (forward_rules): not the SDK's own.
        sent = b"".join(seen.messages)
        assert b"x-specgate-route" in sent and b":path" in sent
        assert b"x-stainless" not in sent and b"user-agent" not in sent


async def test_min_p_and_logit_bias_never_reach_the_spec_engine(pair: EmulatorGroup, tmp_path: Path) -> None:
    async with stack(epp_config(pair), tmp_path) as (envoy, _app):
        c = await client(envoy)
        try:
            for extra in ({"min_p": 0.1}, {"logit_bias": {"42": 3}}):
                for stream in (False, True):
                    raw = await c.chat.completions.with_raw_response.create(
                        model="qwen3-8b",
                        messages=MESSAGES,
                        max_tokens=6,
                        temperature=0.7,
                        stream=stream,
                        extra_body=extra,
                        extra_headers={"x-specgate-route": "spec"},  # even when asked for
                    )
                    assert raw.headers["x-specgate-route"] == "base"
                    assert raw.headers["x-specgate-reason"] == "refused_params"
                    parsed = raw.parse()
                    models = {ch.model async for ch in parsed} if stream else {parsed.model}
                    assert models == {"qwen3-8b-base"}
        finally:
            await c.close()
    assert await served(pair.by_name("qwen3-8b-spec")) == 0
    assert await served(pair.by_name("qwen3-8b-base")) == 4


async def test_an_engine_down_is_served_by_the_fallback_endpoint(
    same_name_pair: EmulatorGroup, tmp_path: Path
) -> None:
    """The spec engine dies before specgate notices: Envoy's retry takes the sibling, the
    second endpoint of the EPP's list."""
    cfg = epp_config(
        same_name_pair,
        **{
            "models.0.pairs.0.spec.served_model_name": "qwen3-8b",
            "models.0.pairs.0.base.served_model_name": "qwen3-8b",
            "scrape.interval_s": 60.0,  # specgate keeps believing spec is up
        },
    )
    spec, base = same_name_pair.engines
    async with stack(cfg, tmp_path) as (envoy, app):
        await spec.runner.cleanup()  # its port now refuses connections
        c = await client(envoy)
        try:
            for _ in range(3):
                raw = await c.chat.completions.with_raw_response.create(
                    model="qwen3-8b",
                    messages=MESSAGES,
                    max_tokens=4,
                    temperature=0,
                    extra_headers={"x-specgate-route": "spec"},
                )
                assert raw.http_response.status_code == 200
                assert raw.parse().usage is not None
        finally:
            await c.close()
        assert await served(base) == 3
        assert await app[STATE].drain(10.0)  # each slot goes when Envoy ends its ext_proc stream
        assert all(e.inflight == 0 for e in app[STATE].engines)


def _closed_port() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s, s.getsockname()[1]


@pytest.mark.parametrize("fail_open", [False, True], ids=["fail-closed", "fail-open"])
async def test_with_the_epp_down_envoy_fails_closed_or_open_to_the_plain_engine(
    same_name_pair: EmulatorGroup, tmp_path: Path, fail_open: bool
) -> None:
    cfg = epp_config(
        same_name_pair,
        **{
            "models.0.pairs.0.spec.served_model_name": "qwen3-8b",
            "models.0.pairs.0.base.served_model_name": "qwen3-8b",
        },
    )
    sock, dead = _closed_port()
    try:
        async with stack(cfg, tmp_path, epp_port=dead, fail_open=fail_open) as (envoy, _app):
            c = await client(envoy)
            try:
                if fail_open:
                    for _ in range(3):
                        answer = await c.chat.completions.create(
                            model="qwen3-8b", messages=MESSAGES, max_tokens=4, temperature=0
                        )
                        assert answer.usage is not None
                else:
                    with pytest.raises(openai.InternalServerError):
                        await c.chat.completions.create(
                            model="qwen3-8b", messages=MESSAGES, max_tokens=4, temperature=0
                        )
            finally:
                await c.close()
    finally:
        sock.close()
    spec, base = same_name_pair.engines
    assert await served(spec) == 0
    assert await served(base) == (3 if fail_open else 0)


def _body_mode(body_mode: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """The bootstrap with the ext_proc filter sending the request body to the EPP without
    waiting for the headers' answer: FULL_DUPLEX_STREAMED with the response headers sent (as
    Istio and kgateway configure it for the Endpoint Picker), or STREAMED with
    send_body_without_waiting_for_header_response."""

    def edit(boot: dict[str, Any]) -> dict[str, Any]:
        ext = http_filter(boot, "envoy.filters.http.ext_proc")
        mode = ext["processing_mode"]
        mode["request_body_mode"] = body_mode
        if body_mode == "FULL_DUPLEX_STREAMED":
            mode["request_trailer_mode"] = "SEND"
            mode["response_header_mode"] = "SEND"
        else:
            ext["send_body_without_waiting_for_header_response"] = True
        return boot

    return edit


@pytest.mark.parametrize("body_mode", ["FULL_DUPLEX_STREAMED", "STREAMED"])
async def test_a_body_sent_without_waiting_is_routed_and_rewritten(
    pair: EmulatorGroup, tmp_path: Path, body_mode: str
) -> None:
    """Envoy streams the body to the EPP without waiting; the EPP answers the headers once
    the whole body is in, then the (rewritten) body: in one piece (full duplex), or piece by
    piece, the last replaced (STREAMED)."""
    async with stack(epp_config(pair), tmp_path, _body_mode(body_mode)) as (envoy, app):
        c = await client(envoy)
        try:
            for stream in (False, True):
                raw = await c.chat.completions.with_raw_response.create(
                    model="qwen3-8b",
                    messages=MESSAGES,
                    max_tokens=6,
                    temperature=0,
                    stream=stream,
                    extra_headers={"x-specgate-route": "spec"},
                )
                assert raw.headers["x-specgate-route"] == "spec"
                parsed = raw.parse()
                models = {ch.model async for ch in parsed} if stream else {parsed.model}
                assert models == {"qwen3-8b-spec"}  # the body reached the engine, renamed
        finally:
            await c.close()
        assert await app[STATE].drain(10.0)  # each slot goes when Envoy ends its ext_proc stream


@pytest.mark.parametrize("share", [0.0, 1.0], ids=["one-trip", "watched"])
async def test_a_watch_share_sends_requests_down_one_path_or_the_other(
    pair: EmulatorGroup, tmp_path: Path, share: float
) -> None:
    """The split layout (``--watch-share``): on the one-trip path the EPP gets the body
    without waiting and never the response phase; on the watched path the body after the
    headers' answer, and the response headers of what it watches. Either way the SDK gets
    the engine the EPP chose, with the route headers."""
    async with stack(epp_config(pair), tmp_path, watch_share=share) as (envoy, app):
        seen = phases(app)
        c = await client(envoy)
        try:
            for route, stream in (("spec", False), ("base", False), ("spec", True)):
                raw = await c.chat.completions.with_raw_response.create(
                    model="qwen3-8b",
                    messages=MESSAGES,
                    max_tokens=8,
                    temperature=0,
                    stream=stream,
                    extra_headers={"x-specgate-route": route},
                )
                assert raw.headers["x-specgate-route"] == route
                assert raw.headers["x-specgate-engine"] == f"{route}0"
                parsed = raw.parse()
                models = {ch.model async for ch in parsed} if stream else {parsed.model}
                assert models == {f"qwen3-8b-{route}"}
        finally:
            await c.close()
        st = app[STATE]
        assert await st.drain(10.0)  # each request is finished when Envoy ends its ext_proc stream
        assert seen.deferred == [share == 0.0] * 3
        assert seen.responses == (3 if share == 1.0 else 0)
        # Envoy resets a one-trip stream once the request is answered (nothing more is sent
        # there): the end of the EPP's part, counted unobserved, never a client's disconnect.
        assert seen.finished == ([(0, None)] * 3 if share == 0.0 else [(200, None)] * 3)
        assert all(e.inflight == 0 for e in st.engines)


@pytest.mark.parametrize("share", [0.0, 1.0], ids=["one-trip", "watched"])
async def test_either_path_refuses_bad_requests_in_openai_form_before_any_engine(
    pair: EmulatorGroup, tmp_path: Path, share: float
) -> None:
    """A body over ``server.max_body_bytes`` (sent in pieces on the one-trip path), a body
    that is not JSON and a model nobody serves: Envoy answers specgate's error, OpenAI-shaped,
    and no engine is asked."""
    cfg = epp_config(pair, **{"server.max_body_bytes": 4096})
    async with stack(cfg, tmp_path, watch_share=share) as (envoy, app):
        url = f"{envoy.url}/v1/chat/completions"
        big = {"model": "qwen3-8b", "messages": [{"role": "user", "content": "x" * 20_000}], "max_tokens": 4}
        cases = [
            (json.dumps(big).encode(), 413),
            (b'{"model": "qwen3-8b", "messages": [', 400),
            (json.dumps({**big, "model": "nobody", "messages": MESSAGES}).encode(), 404),
        ]

        async def pieces(body: bytes) -> AsyncIterator[bytes]:
            for i in range(0, len(body), 1000):
                yield body[i : i + 1000]
                await asyncio.sleep(0)

        async with aiohttp.ClientSession() as s:
            for body, status in cases:
                headers = {"content-type": "application/json"}
                for data in (body, pieces(body)):  # with a content-length, then chunked
                    async with s.post(url, data=data, headers=headers) as r:
                        assert r.status == status, await r.text()
                        err = (await r.json(content_type=None))["error"]
                        assert err["message"] and err["type"]
        assert app[STATE].inflight == 0
    spec, base = pair.engines
    assert await served(spec) == 0 and await served(base) == 0


@pytest.mark.parametrize("share", [0.0, 1.0], ids=["one-trip", "watched"])
async def test_a_slow_upload_is_routed_on_either_path(
    pair: EmulatorGroup, tmp_path: Path, share: float
) -> None:
    """A client that pauses mid-body for longer than the filter's message timeout: Envoy
    takes the body before asking specgate on either path, so the pause is the client's and
    the request is answered (on the one-trip path, without the buffer, the headers' answer
    would wait for the body's end and Envoy would give up on specgate with a 504)."""
    async with stack(epp_config(pair), tmp_path, watch_share=share, message_timeout_s=0.2) as (envoy, _):
        body = json.dumps({"model": "qwen3-8b", "messages": MESSAGES, "max_tokens": 4}).encode()
        resumed = asyncio.Event()

        async def pieces() -> AsyncIterator[bytes]:
            yield body[:20]
            # Longer than the message timeout: Envoy's own timer, no race with ours.
            await asyncio.sleep(0.6)
            resumed.set()
            yield body[20:]

        async with aiohttp.ClientSession() as s:
            url = f"{envoy.url}/v1/chat/completions"
            async with s.post(url, data=pieces(), headers={"content-type": "application/json"}) as r:
                assert r.status == 200, await r.text()
                assert (await r.json())["model"].startswith("qwen3-8b-")
        assert resumed.is_set()


@pytest.mark.parametrize("body_mode", ["BUFFERED", "STREAMED", "FULL_DUPLEX_STREAMED"])
async def test_how_long_a_request_holds_its_slot_depends_on_the_body_mode(
    pair: EmulatorGroup, tmp_path: Path, body_mode: str
) -> None:
    """The generated bootstrap (BUFFERED) keeps the ext_proc stream to the answer's end, so
    the request holds its slot while it streams, as in the proxy. Where the body is sent
    without waiting, Envoy ends the stream early (STREAMED: once the request is answered;
    full duplex: once the response headers are): the slot is gone mid-answer. None of them
    is counted as an error."""
    cfg = epp_config(pair, **{"epp.observe_per_s": 0})
    edit = _body_mode(body_mode) if body_mode != "BUFFERED" else (lambda boot: boot)
    async with stack(cfg, tmp_path, edit) as (envoy, app):
        seen = phases(app)
        c = await client(envoy)
        try:
            stream = await c.chat.completions.create(
                model="qwen3-8b",
                messages=MESSAGES,
                max_tokens=4000,  # seconds of decoding: still streaming when the slot is read
                temperature=0,
                stream=True,
                extra_headers={"x-specgate-route": "base"},
            )
            async for _chunk in stream:
                break
            assert app[STATE].inflight == (1 if body_mode == "BUFFERED" else 0)
            await stream.close()  # the client goes: Envoy ends what is left
        finally:
            await c.close()
        assert await app[STATE].drain(10.0)
        # Unwatched, the answer's end and a client gone read alike (unobserved); in full
        # duplex the response headers came: their status.
        assert seen.finished == [(200, None) if body_mode == "FULL_DUPLEX_STREAMED" else (0, None)]
