"""Forward one request to its engine: attempts with failover, then relay to the client.

Rules:
- an attempt that fails before any byte reached the client (connect error, 5xx,
  timeout waiting for the response or the first stream event) is retried once on the
  decision's fallback engine, when there is one and retries are enabled;
- once bytes reached the client nothing is retried: a stream that breaks gets an
  ``data: {"error": ...}`` event, then ``data: [DONE]``;
- a client that goes away closes the upstream response at once (the engine sees the
  connection drop and aborts the request);
- every wait is bounded: connect, first byte, idle between events, total.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from gateway.config.models import ModelConfig
from gateway.engines.runtime import EngineRuntime
from gateway.proxy.body import splice_model
from gateway.proxy.handoff import MoveRequest, TicketHold, release
from gateway.proxy.move import MOVE, MoveBoard, MoveTicket
from gateway.proxy.nonstream import BodyRelay
from gateway.proxy.pool import UpstreamPool
from gateway.proxy.relay import client_timeout, engine_headers, upstream_url
from gateway.proxy.result import ProxyResult, Retryable
from gateway.proxy.sse import Harvest
from gateway.proxy.stream import StreamRelay
from gateway.routing.types import Decision, Reason
from gateway.telemetry.hooks import RequestTelemetry
from gateway.telemetry.logthrottle import LogThrottle
from gateway.wire.errors import ApiError, engine_error, error_body
from gateway.wire.headers import downstream_headers

log = logging.getLogger(__name__)

MAX_ERROR_BODY = 64 * 1024
_UNREACHABLE = frozenset({"connect", "connect_timeout"})
_CHUNKED_UPLOAD = 512 * 1024  # bodies from this size go upstream as a stream of chunks
_THROTTLE = LogThrottle(5.0)  # one failover warning per engine and error kind per 5 s


@dataclass(slots=True)
class ProxyCall(StreamRelay, BodyRelay):
    """One request forwarded: everything it needs is passed in (nothing is read from the app)."""

    request: web.Request
    body: dict[str, Any]
    endpoint: str
    client_model: str
    stream: bool
    include_usage: bool
    decision: Decision
    model: ModelConfig
    engines: Mapping[str, EngineRuntime]
    pool: UpstreamPool
    telemetry: RequestTelemetry
    request_id: str
    started: float = field(default_factory=time.monotonic)
    collect_text: bool = True  # keep the completion text for learning (costs a JSON parse per event)
    raw: bytes = b""  # the client's body as received (spliced, not re-serialised, when exact)
    forward_headers: frozenset[str] = frozenset()  # server.forward_headers (beyond the allow-list)
    streams: set[asyncio.Task[Any]] | None = None  # where a relaying stream registers (shutdown cuts it)
    moves: MoveBoard | None = None  # the model's streams that may move at a flip (None: never)
    move_request: MoveRequest | None = None  # set by run() when this request could move
    hold: TicketHold = field(default_factory=TicketHold)  # its ticket on the move board

    async def run(self) -> ProxyResult:
        if self.moves is not None and self.stream:
            t = self.model.timeouts
            req = MoveRequest(
                self.body,
                self.endpoint,
                self.request_id,
                self.request.headers,
                self.forward_headers,
                t.connect_s,
                t.first_byte_s,
            )
            self.move_request = req if req.can_move() else None
        try:
            return await self._run()
        finally:
            if self.hold.ticket is not None and self.moves is not None:
                self.moves.withdraw(self.hold.ticket)

    async def _run(self) -> ProxyResult:
        d = self.decision
        candidates = [d.engine]
        if d.fallback and d.fallback != d.engine and self.model.retry.on_sibling:
            candidates.append(d.fallback)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.model.timeouts.total_s
        result = ProxyResult(response=web.Response(), harvest=Harvest(collect_text=self.collect_text))
        unreachable = 0  # attempts that could not even connect
        for attempt, name in enumerate(candidates):
            rt = self.engines[name]
            last = attempt == len(candidates) - 1
            result.engine, result.route = name, rt.route
            # after a move (the first attempt queued on the old engine) the sibling takes it
            # as the regime's engine: no retry, nobody blamed
            result.reason = d.reason if attempt == 0 else Reason.MOVED if result.moved else Reason.FAILOVER
            result.retried = attempt > 0 and not result.moved
            result.error = None
            waiting = self._wait_for_first_byte(rt, last)
            try:
                with rt.track():
                    await self._attempt(rt, attempt, deadline, result)
                return result
            except asyncio.CancelledError as exc:
                if waiting is None or MOVE not in exc.args or waiting.waiting is None:
                    raise
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
                rt.closed_early()  # queued there: the engine drops it once it sees the close
                self._withdraw_ticket()
                result.moved = True
                self.telemetry.stream_moved(name, "moved_queued")
            except Retryable as exc:
                self.telemetry.upstream_failed(name, exc.error, not last)
                _THROTTLE.log(
                    log,
                    logging.WARNING,
                    f"{name}:{exc.error}",
                    "engine %s failed before the first byte (%s)%s",
                    name,
                    exc.error,
                    "; retrying on " + candidates[attempt + 1] if not last else "",
                    extra={"request_id": self.request_id},
                )
                result.error = exc.error
                result.status = exc.response.status
                result.response = exc.response
                unreachable += exc.error in _UNREACHABLE
                if last:
                    if unreachable == len(candidates) and self._none_left(candidates):
                        self._all_unreachable(result)
                    return result
        return result  # pragma: no cover - loop always returns

    def _wait_for_first_byte(self, rt: EngineRuntime, last: bool) -> MoveTicket | None:
        """A stream's attempt with a sibling to go to: on the move board while it waits for
        its first byte, so that a regime flip sends it there at once (a queued request
        costs the old engine nothing to drop, and would otherwise run there beside the new
        regime). The relay takes the ticket over at the first byte (:meth:`_first_byte`)."""
        if self.moves is None or not self.stream or last:
            return None
        self.hold.ticket = self.moves.enlist(rt.route, rt.name)
        self.hold.ticket.waiting = asyncio.current_task()
        return self.hold.ticket

    def _withdraw_ticket(self) -> None:
        if self.hold.ticket is not None and self.moves is not None:
            self.moves.withdraw(self.hold.ticket)
        self.hold.ticket = None

    def _none_left(self, tried: list[str]) -> bool:
        """No engine of the model that was not tried is healthy (so none could have served)."""
        return all(not rt.healthy() for name, rt in self.engines.items() if name not in tried)

    def _all_unreachable(self, result: ProxyResult) -> None:
        """Every engine of the pair refused the connection: the model is unavailable (503)."""
        err = ApiError(
            503,
            f"no engine of model '{self.client_model}' is reachable right now; retry shortly",
            code="no_engine_available",
        )
        headers = self._client_headers(self.engines[result.engine or self.decision.engine], result.reason)
        headers["Retry-After"] = "1"
        result.status = 503
        result.response = web.Response(
            status=503, body=json.dumps(err.body()).encode(), content_type="application/json", headers=headers
        )

    # -- one attempt -------------------------------------------------------------------
    def _payload(self, rt: EngineRuntime) -> bytes:
        served = rt.config.served_model_name
        if self.raw:
            add_usage = self.stream and not self.include_usage
            spliced = splice_model(self.raw, self.client_model, served, add_usage=add_usage)
            if spliced is not None:
                return spliced
        body = dict(self.body)
        body["model"] = served
        if self.stream and not self.include_usage:
            opts = body.get("stream_options")
            body["stream_options"] = {**(opts if isinstance(opts, dict) else {}), "include_usage": True}
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()

    def _first_byte_budget(self) -> float:
        """Seconds an attempt may wait for the engine's first byte: a stream's first event,
        or a non-streamed answer, which arrives whole (so its decode time is added)."""
        t = self.model.timeouts
        if self.stream:
            return t.first_byte_s
        n = self.body.get("max_completion_tokens", self.body.get("max_tokens"))
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            return t.total_s  # unbounded answer: only the total bounds it
        return t.first_byte_s + min(n, 1_000_000) * t.nonstream_token_s

    async def _attempt(self, rt: EngineRuntime, attempt: int, deadline: float, result: ProxyResult) -> None:
        loop = asyncio.get_running_loop()
        t = self.model.timeouts
        headers = engine_headers(self.request.headers, self.forward_headers, self.request_id, rt)
        try:
            headers.update(self.telemetry.upstream_started(rt.name, attempt))
        except Exception:
            log.exception("telemetry upstream_started failed")
        url = upstream_url(rt.config.url, self.endpoint)
        # Each attempt has its own first-byte budget (a retry never inherits what the first
        # attempt used); the request's total caps it, and if that cap is what runs out, the
        # engine is not blamed: it did not get its budget.
        own = loop.time() + self._first_byte_budget()
        first_deadline = min(deadline, own)
        capped = first_deadline < own
        session = self.pool.session(rt.name)
        timeout = client_timeout(t.connect_s)
        resp: aiohttp.ClientResponse | None = None
        reason = result.reason
        try:
            try:
                async with asyncio.timeout_at(first_deadline):
                    payload = self._payload(rt)
                    # aiohttp writes a large bytes body in one go; a stream of it in chunks.
                    data = payload if len(payload) < _CHUNKED_UPLOAD else io.BytesIO(payload)
                    resp = await session.post(url, data=data, headers=headers, timeout=timeout)
            except aiohttp.ConnectionTimeoutError:
                raise self._fail(
                    rt, "connect_timeout", 502, f"engine {rt.name} did not accept the connection", reason
                ) from None
            except TimeoutError:
                if capped:
                    raise self._fail(
                        rt, "total_timeout", 504, "request exceeded its total time limit", reason, blame=False
                    ) from None
                raise self._fail(
                    rt, "first_byte_timeout", 504, f"engine {rt.name} did not answer in time", reason
                ) from None
            except (aiohttp.ClientError, OSError) as exc:
                raise self._fail(
                    rt, "connect", 502, f"engine {rt.name} is unreachable ({type(exc).__name__})", reason
                ) from None

            if resp.status >= 500:
                await self._engine_5xx(rt, resp, reason, first_deadline)
            rt.record_success()
            try:
                self.telemetry.upstream_first_byte(rt.name)
            except Exception:
                log.exception("telemetry upstream_first_byte failed")
            ctype = resp.headers.get("Content-Type", "")
            if resp.status == 200 and ctype.startswith("text/event-stream"):
                await self._relay_stream(rt, resp, first_deadline, deadline, result)
            else:
                # A non-streamed answer's read has the attempt's budget; a stream's error body, the total.
                until, total = (deadline, True) if self.stream else (first_deadline, capped)
                await self._relay_body(rt, resp, until, result, total=total)
        finally:
            if resp is not None:
                release(resp, rt)

    async def _engine_5xx(
        self, rt: EngineRuntime, resp: aiohttp.ClientResponse, reason: str | None, until: float
    ) -> None:
        """A 5xx before any byte reached the client: retryable; the engine's body is kept."""
        rt.record_failure(f"status_{resp.status}")
        body = b""
        try:
            async with asyncio.timeout_at(until):
                body = await resp.content.read(MAX_ERROR_BODY)
        except (TimeoutError, aiohttp.ClientError, OSError):
            pass
        headers = self._client_headers(rt, reason)
        headers.update(downstream_headers(resp.headers))
        err = _engine_error(body, resp.status) or error_body(
            f"engine {rt.name} failed with HTTP {resp.status}", "upstream_error", "upstream_error", None
        )
        out = web.Response(
            status=resp.status,
            body=json.dumps(err).encode(),
            content_type="application/json",
            headers=headers,
        )
        raise Retryable("status_5xx", out)


def _engine_error(body: bytes, status: int) -> dict[str, object] | None:
    """The engine's JSON error body in the gateway's shape; None when it is not one."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    return engine_error(obj, status) if isinstance(obj, dict) else None
