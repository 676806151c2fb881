"""The emulated vLLM OpenAI server: one aiohttp app per engine.

Endpoints as vLLM serves them: ``POST /v1/completions``, ``POST /v1/chat/completions``
(streaming and not), ``GET /v1/models``, ``GET /health``, ``GET|POST /ping``,
``GET /version``, ``GET /metrics``. Admin (emulator only): ``GET|POST
/_emulator/faults`` (read / change fault knobs, JSON) and ``GET /_emulator/state``.

Build an engine with :func:`make_engine` (engine + metrics on a device driver), an app
with :func:`build_engine_app`, and serve it with :func:`serve_app`; ``cli_emulate``
does all three for one engine or a spec+base pair on one device.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError

from gateway.emulator.device import DeviceDriver
from gateway.emulator.engine import Engine, EngineConfig, EngineRequest, TokenEvent
from gateway.emulator.faults import Faults
from gateway.emulator.metrics import EngineMetrics
from gateway.emulator.protocol import (
    SPEC_UNSUPPORTED_MESSAGE,
    SSE_DONE,
    ApiError,
    ParsedRequest,
    chunk,
    error_body,
    full_response,
    models_body,
    new_id,
    parse_request,
    sse,
    usage,
)

VLLM_VERSION = "0.20.2"
MAX_BODY_BYTES = 32 * 1024 * 1024


@dataclass(eq=False)
class EmulatedEngine:
    """An engine, its metrics and faults, stepping on a (possibly shared) device driver."""

    engine: Engine
    driver: DeviceDriver
    metrics: EngineMetrics
    faults: Faults = field(default_factory=Faults)
    per_request_metrics: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    requests_seen: int = 0
    dead: bool = False
    #: called once when the engine crashes (e.g. closes its listening socket)
    on_crash: Callable[[], Awaitable[None]] | None = None
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    _open: dict[int, web.Request] = field(default_factory=dict)
    _hang_release: asyncio.Event | None = None

    @property
    def name(self) -> str:
        return self.engine.config.served_model_name

    def hang_event(self) -> asyncio.Event:
        if self._hang_release is None:
            self._hang_release = asyncio.Event()
        return self._hang_release

    def set_faults(self, update: dict[str, Any]) -> None:
        merged = self.faults.model_dump() | update
        self.faults = Faults.model_validate(merged)
        if self.faults.hang == "none" and self._hang_release is not None:
            self._hang_release.set()  # release requests held by a hang
            self._hang_release = None

    async def crash(self) -> None:
        """Die like a killed process: every request is lost and every connection cut."""
        if self.dead:
            return
        self.dead = True
        for req in list(self.engine.running) + list(self.engine.waiting):
            self.engine.abort(req, self.driver.now())
        for r in list(self._open.values()):
            _cut(r)
        if self.on_crash is not None:
            await self.on_crash()


def make_engine(
    config: EngineConfig,
    driver: DeviceDriver,
    *,
    log_stats: bool = True,
    per_request_metrics: bool = False,
    faults: Faults | None = None,
) -> EmulatedEngine:
    metrics = EngineMetrics(
        config.served_model_name,
        spec_k=config.spec.k if config.spec else None,
        max_model_len=config.max_model_len,
        log_stats=log_stats,
        num_gpu_blocks=config.num_gpu_blocks,
    )
    engine = Engine(config, observer=metrics)
    metrics.engine = engine
    driver.device.attach(engine)
    return EmulatedEngine(
        engine, driver, metrics, faults or Faults(), per_request_metrics, rng=random.Random(config.seed)
    )


ENGINE = web.AppKey("engine", EmulatedEngine)


def _cut(request: web.Request) -> None:
    tr = request.transport
    if tr is not None:
        tr.abort()


def _json(obj: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(obj, separators=(",", ":")).encode(), status=status, content_type="application/json"
    )


def _err(e: ApiError) -> web.Response:
    return _json(e.body(), e.status)


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _version(request: web.Request) -> web.Response:
    return _json({"version": VLLM_VERSION})


async def _models(request: web.Request) -> web.Response:
    h = request.app[ENGINE]
    cfg = h.engine.config
    return _json(models_body(cfg.served_model_name, cfg.model, cfg.max_model_len, h.created))


async def _metrics(request: web.Request) -> web.StreamResponse:
    h = request.app[ENGINE]
    f = h.faults
    if f.metrics_delay_s:
        await asyncio.sleep(f.metrics_delay_s)
    if f.garbage_metrics:
        return web.Response(text="<html>definitely { not prometheus\nvllm:broken{{ = NaN NaN\n", status=200)
    h.driver.poll()
    return web.Response(body=h.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _get_faults(request: web.Request) -> web.Response:
    return _json(request.app[ENGINE].faults.model_dump())


async def _post_faults(request: web.Request) -> web.Response:
    h = request.app[ENGINE]
    try:
        update = await request.json()
        if not isinstance(update, dict):
            raise ValueError("body must be a JSON object")
        h.set_faults(update)
    except (ValueError, ValidationError) as e:
        return _json(error_body(str(e), "BadRequestError", 400), 400)
    return _json(h.faults.model_dump())


async def _state(request: web.Request) -> web.Response:
    h = request.app[ENGINE]
    h.driver.poll()
    e = h.engine
    s = e.stats
    return _json(
        {
            "model": e.config.served_model_name,
            "speculative_config": e.spec.as_dict() if e.spec else None,
            "profile": e.profile.name,
            "device": h.driver.device.name,
            "emulated_time_s": h.driver.now(),
            "time_scale": h.driver.clock.time_scale,
            "delivery_lag_s": h.driver.lag_s,
            "running": e.num_running,
            "waiting": e.num_waiting,
            "kv_cache_usage": e.kv_usage(),
            "steps": s.steps,
            "busy_s": s.busy_s,
            "prompt_tokens": s.prompt_tokens,
            "generation_tokens": s.generation_tokens,
            "num_drafts": s.num_drafts,
            "num_draft_tokens": s.num_draft_tokens,
            "num_accepted_tokens": s.num_accepted,
            "accepted_per_pos": s.accepted_per_pos,
            "finished": s.finished,
            "dead": h.dead,
        }
    )


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


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def _chat(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def _generate(request: web.Request, *, chat: bool) -> web.StreamResponse:
    h = request.app[ENGINE]
    if h.dead:
        _cut(request)
        return web.Response(status=503)
    h.requests_seen += 1
    f = h.faults
    crash_after_chunks: int | None = None
    if f.crash_after_requests is not None and h.requests_seen > f.crash_after_requests:
        if not f.crash_mid_stream:
            await h.crash()
            _cut(request)
            return web.Response(status=503)
        crash_after_chunks = f.mid_stream_chunks
    if f.hang == "accept":
        await h.hang_event().wait()
    if f.error_rate and h.rng.random() < f.error_rate:
        return _json(
            error_body("emulated engine failure (error_rate fault)", "InternalServerError", 500), 500
        )
    cfg = h.engine.config
    try:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ApiError("request body is not valid JSON") from None
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
            return _json(err.body(), 400)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **headers})
        await resp.prepare(request)
        await resp.write(sse(err.body()) + SSE_DONE)
        await resp.write_eof()
        return resp
    reqs = _make_requests(h, pr, rid)
    h._open[id(request)] = request
    try:
        if pr.stream:
            return await _stream(request, h, pr, reqs, rid, created, headers, crash_after_chunks)
        return await _unary(request, h, pr, reqs, rid, created, headers)
    except ConnectionResetError:
        return web.Response(status=499)  # the client went away; nobody reads this
    finally:
        h._open.pop(id(request), None)
        for r in reqs:
            if r.finish_reason is None and not h.dead:
                h.driver.abort(h.engine, r)  # client went away: free the slot at once


def _make_requests(h: EmulatedEngine, pr: ParsedRequest, rid: str) -> list[EngineRequest]:
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


def _prompt_total(pr: ParsedRequest) -> int:
    return sum(len(t) for t in pr.prompt_tokens) * pr.n


async def _unary(
    request: web.Request,
    h: EmulatedEngine,
    pr: ParsedRequest,
    reqs: list[EngineRequest],
    rid: str,
    created: int,
    headers: dict[str, str],
) -> web.StreamResponse:
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
            _cut(request)
            return web.Response(status=503)
    choices = [("".join(r.output), r.finish_reason or "stop") for r in reqs]
    body = full_response(
        chat=pr.chat,
        rid=rid,
        created=created,
        model=h.name,
        choices=choices,
        prompt_tokens=_prompt_total(pr),
        completion_tokens=sum(len(r.output) for r in reqs),
    )
    if h.per_request_metrics and h.engine.spec is not None:
        body["metrics"] = _spec_metrics(reqs)
    resp = _json(body)
    resp.headers.update(headers)
    return resp


async def _stream(
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
            started[i] = True
            c = chunk(
                chat=pr.chat,
                rid=rid,
                created=created,
                model=model,
                index=i,
                text="".join(ev.tokens),
                finish_reason=ev.finish_reason,
            )
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
            _cut(request)
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


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status >= 400:
            return _json(
                error_body(e.reason, "NotFoundError" if e.status == 404 else "BadRequestError", e.status),
                e.status,
            )
        raise
    except ConnectionResetError:
        raise
    except asyncio.CancelledError:
        raise


def build_engine_app(handle: EmulatedEngine) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_errors])
    app[ENGINE] = handle
    app.router.add_get("/health", _health)
    app.router.add_route("*", "/ping", _health)
    app.router.add_get("/version", _version)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/metrics", _metrics)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_get("/_emulator/faults", _get_faults)
    app.router.add_post("/_emulator/faults", _post_faults)
    app.router.add_get("/_emulator/state", _state)
    return app


async def serve_app(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, web.TCPSite]:
    """Start ``app`` on ``host:port`` (handlers are cancelled when their client goes away)."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, site


def bound_port(runner: web.AppRunner) -> int:
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            return int(addr[1])
    raise RuntimeError("runner is not listening")
