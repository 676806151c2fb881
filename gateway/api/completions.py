"""``POST /v1/chat/completions`` and ``POST /v1/completions``: validate, decide, forward, learn.

The handler is a sequence of named steps (:meth:`Exchange.serve`); :class:`Exchange`
carries what the steps learn about the request and what the request reports when it ends
(status, error, token counts, the model label), so that every way out of the handler,
refusals, errors and client disconnects included, is accounted for once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import NamedTuple

from aiohttp import web
from multidict import CIMultiDict

from gateway.api.auth import HasHeaders, check_client, check_model_access, may_override_route
from gateway.api.body import check_content_encoding, decoded, parse_body, parse_features
from gateway.api.features import CHAT, COMPLETIONS, RESPONSES, ParsedRequest, model_name
from gateway.api.fleet import ask_moves
from gateway.api.learning import learn_with_lookup, observe, wants_lookup
from gateway.api.state import STATE, GatewayState, rid_of
from gateway.engines.runtime import ModelRuntime
from gateway.proxy.forward import ProxyCall
from gateway.proxy.move import MoveBoard
from gateway.proxy.result import ProxyResult
from gateway.routing.adaptive.live import engine_load
from gateway.routing.rules import NoEngineAvailable
from gateway.routing.static import FixedPolicy
from gateway.routing.types import Decision, ModelView, Reason, RequestFeatures, Route
from gateway.telemetry.hooks import RequestTelemetry
from gateway.wire.errors import ApiError, error_response
from gateway.wire.headers import REASON, REQUEST_ID, ROUTE

log = logging.getLogger(__name__)


BODY_TIMEOUT_S = 30.0  # a client trickling its body must not hold a concurrency slot for ever


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _handle(request, CHAT)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _handle(request, COMPLETIONS)


async def responses(request: web.Request) -> web.StreamResponse:
    """``POST /v1/responses`` (the Responses API): decided as chat; its streams never move."""
    return await _handle(request, RESPONSES)


async def _handle(request: web.Request, endpoint: str) -> web.StreamResponse:
    ex = Exchange.begin(request, endpoint)
    refusal = overloaded(ex.st)
    if refusal is not None:
        return ex.refuse(refusal)
    ex.st.inflight += 1
    try:
        return await ex.serve()
    except ApiError as exc:
        return ex.failed(exc)
    except (asyncio.CancelledError, ConnectionResetError):
        ex.status, ex.error = 499, "client_disconnected"
        raise
    finally:
        ex.close()


class Refusal(NamedTuple):
    """A request turned away before it holds a slot: the error and its telemetry label."""

    error: ApiError
    label: str


def overloaded(st: GatewayState) -> Refusal | None:
    """Admission: None when the gateway takes the request (not draining, under its limit)."""
    if st.draining:
        err = ApiError(
            503,
            "the gateway is shutting down; retry on another instance",
            code="shutting_down",
            headers={"Retry-After": "1", "Connection": "close"},
        )
        return Refusal(err, "shutting_down")
    if st.inflight >= st.config.server.max_concurrency:
        err = ApiError(
            429,
            "the gateway is at its concurrency limit; retry shortly",
            code="too_many_requests",
            headers={"Retry-After": "1"},
        )
        return Refusal(err, "concurrency_limit")
    return None


@dataclass(slots=True)
class Exchange:
    """One request through the handler, from admission to the accounting at its end."""

    st: GatewayState
    request: web.Request
    endpoint: str
    rid: str
    started: float
    headers: CIMultiDict[str]  # sent with every error (x-request-id, then the route)
    # What the request reports when it ends (telemetry ``finished``).
    model: str = "unknown"  # the label: the model's name once it is admitted
    status: int = 500
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    tel: RequestTelemetry | None = None
    counted: ModelRuntime | None = None  # the model whose in-flight count this request holds

    @classmethod
    def begin(cls, request: web.Request, endpoint: str) -> Exchange:
        started = time.monotonic()
        rid = rid_of(request)
        return cls(request.app[STATE], request, endpoint, rid, started, CIMultiDict({REQUEST_ID: rid}))

    # -- the steps, in order -------------------------------------------------------------
    async def serve(self) -> web.StreamResponse:
        """Admitted: authenticate, read, find the model, parse, decide, forward, learn."""
        server = self.st.config.server
        self.authenticate()  # before reading the body
        raw = await read_body(self.request, server.max_body_bytes)
        body = await parse_body(raw, server)
        mrt = self.admit_model(model_name(body))
        parsed = await parse_features(
            body,
            len(raw),
            self.endpoint,
            self.request.headers.get(ROUTE),
            allow_override=may_override_route(self.request, mrt.config.routing),
        )
        self.tel = tel = self.start_telemetry()
        decision = self.decide(mrt, parsed.features, tel)
        # Decide now whether this answer feeds the realised-lookup learning (bounded rate):
        # only then is its text collected, which costs a JSON parse per stream event.
        collect = bool(parsed.prompt_text) and self.st.lookup_budget(self.model).take()
        result = await self.forward(mrt, parsed, decision, raw, tel, collect=collect)
        self.account(result)
        self.learn(mrt, parsed, decision, result, collect=collect)
        return result.response

    def authenticate(self) -> None:
        """The client's key, when every model needs one (model keys are checked per model)."""
        authenticate(self.st, self.request)

    def admit_model(self, name: str) -> ModelRuntime:
        """The model the body names (:func:`admit_model`). Holds a slot of the model from
        here on (released by :meth:`close`)."""
        mrt = admit_model(self.st, self.request, name)
        mrt.inflight += 1
        self.counted = mrt
        self.model = name
        return mrt

    def start_telemetry(self) -> RequestTelemetry:
        return self.st.telemetry.start_request(self.model, self.endpoint, self.rid, self.request.headers)

    def decide(self, mrt: ModelRuntime, features: RequestFeatures, tel: RequestTelemetry) -> Decision:
        """The policy's decision, timed; its route and reason go into the response headers."""
        t0 = time.perf_counter()
        decision = choose_route(mrt, self.model, features)
        decision_s = time.perf_counter() - t0
        self.headers[ROUTE] = decision.route.value
        self.headers[REASON] = decision.reason
        ask_moves(self.st, mrt, decision)
        if mrt.on_decided:
            tell_decided(mrt, features, decision)
        try:
            tel.decided(features, decision, decision_s)
        except Exception:
            log.exception("telemetry decided failed")
        return decision

    async def forward(
        self,
        mrt: ModelRuntime,
        parsed: ParsedRequest,
        decision: Decision,
        raw: bytes,
        tel: RequestTelemetry,
        *,
        collect: bool,
    ) -> ProxyResult:
        """Relay to the engine chosen (failover included); the proxy gets all it needs here."""
        call = ProxyCall(
            request=self.request,
            body=parsed.body,
            endpoint=self.endpoint,
            client_model=self.model,
            stream=parsed.features.stream,
            include_usage=parsed.include_usage,
            decision=decision,
            model=mrt.config,
            engines=mrt.engines,
            pool=self.st.pool,
            telemetry=tel,
            request_id=self.rid,
            started=self.started,
            collect_text=collect,
            raw=raw,
            forward_headers=self.st.forward_headers,
            streams=self.st.streams,
            moves=self.st.moves.setdefault(self.model, MoveBoard())
            if mrt.config.routing.move_on_flip and self.endpoint != RESPONSES
            else None,
        )
        return await call.run()

    def account(self, result: ProxyResult) -> None:
        self.status = result.status
        self.error = result.error
        self.prompt_tokens = result.harvest.prompt_tokens
        self.completion_tokens = result.harvest.completion_tokens
        if result.harvest.reasoning_events and self.tel is not None:
            try:
                self.tel.reasoning_tokens(result.harvest.reasoning_tokens)
            except Exception:
                log.exception("telemetry reasoning_tokens failed")

    def learn(
        self,
        mrt: ModelRuntime,
        parsed: ParsedRequest,
        decision: Decision,
        result: ProxyResult,
        *,
        collect: bool,
    ) -> None:
        """Feed the answer to the policy: with the realised lookup (in the background) when
        this answer is a lookup sample, else at once."""
        features = parsed.features
        if collect and wants_lookup(result):
            self.st.spawn(
                learn_with_lookup(
                    mrt,
                    features,
                    decision,
                    result,
                    parsed.prompt_text,
                    started=self.started,
                    advice=self.st.advice_for(self.model),
                )
            )
        else:
            observe(mrt, features, decision, result, started=self.started)

    # -- the ways out ----------------------------------------------------------------------
    def refuse(self, refusal: Refusal) -> web.Response:
        """Turned away at admission: reported at once (no slot was taken)."""
        self.start_telemetry().finished(refusal.error.status, error=refusal.label)
        return error_response(refusal.error, self.headers)

    def failed(self, exc: ApiError) -> web.Response:
        self.status, self.error = exc.status, exc.code or exc.type
        return error_response(exc, self.headers)

    def close(self) -> None:
        """Release the slots this request held and report how it ended."""
        if self.counted is not None:
            self.counted.inflight -= 1
        self.st.request_done()
        if self.tel is None:
            self.tel = self.start_telemetry()
        try:
            self.tel.finished(
                self.status,
                prompt_tokens=self.prompt_tokens,
                completion_tokens=self.completion_tokens,
                error=self.error,
            )
        except Exception:
            log.exception("telemetry finished failed")


async def read_body(request: web.Request, limit: int) -> bytes:
    """The request body, bounded in size (413), encoding (415/400) and time (408)."""
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(413, f"request body exceeds {limit} bytes", code="request_too_large")
    coding = request.headers.get("Content-Encoding")
    check_content_encoding(coding)
    try:
        if request.content.is_eof():  # the whole body already arrived: no timer needed
            raw = await request.read()
        else:
            async with asyncio.timeout(BODY_TIMEOUT_S):
                raw = await request.read()
    except TimeoutError:
        raise ApiError(
            408, f"request body not received within {BODY_TIMEOUT_S:g} s", code="request_timeout"
        ) from None
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, f"request body exceeds {limit} bytes", code="request_too_large") from None
    except web.RequestPayloadError:  # cut short, or a malformed chunked framing
        raise ApiError(400, "request body could not be read", code="invalid_body") from None
    return await decoded(raw, coding, limit)


_SAFE_POLICY = FixedPolicy(Route.BASE)


def tell_decided(mrt: ModelRuntime, features: RequestFeatures, decision: Decision) -> None:
    """The model's decision hooks (the peer channel), with the load the pair held: the
    requests on its spec and plain engines, as the policy counts them. Never raises."""
    try:
        now = time.monotonic()
        pair = mrt.pair_of(decision.engine)  # pairs come and go: never "the first one"
        loads = (
            0.0 if pair is None or pair.spec is None else engine_load(pair.spec.view(now, mrt.stale_after_s)),
            0.0 if pair is None else engine_load(pair.base.view(now, mrt.stale_after_s)),
        )
        for hook in mrt.on_decided:
            hook(features, decision, loads)
    except Exception:
        log.exception("decision hook failed (request unaffected)")


def authenticate(st: GatewayState, request: HasHeaders) -> None:
    """The client's key, when every model needs one (model keys are checked per model)."""
    if st.client_keys and not st.open_models:
        check_client(request, st.client_keys)


def admit_model(st: GatewayState, request: HasHeaders, name: str) -> ModelRuntime:
    """The model ``name`` for this request: access (its keys), existence (404), its own
    concurrency limit (429). Takes no slot: the caller does."""
    mrt = st.models.get(name)
    check_model_access(
        request,
        name,
        None if mrt is None else mrt.config.api_keys,
        st.config.server.api_keys,
        st.client_keys,
    )
    if mrt is None:  # no keys configured: nothing to hide
        raise ApiError(
            404,
            f"The model '{name[:200]}' does not exist. Known models: {', '.join(st.models)}",
            param="model",
            code="model_not_found",
        )
    limit = mrt.config.max_concurrency
    if limit is not None and mrt.inflight >= limit:
        raise ApiError(
            429,
            f"model '{name}' is at its concurrency limit; retry shortly",
            code="too_many_requests",
            headers={"Retry-After": "1"},
        )
    return mrt


def choose_route(
    mrt: ModelRuntime,
    model: str,
    features: RequestFeatures,
    view: ModelView | None = None,
    *,
    where: str = "",
) -> Decision:
    """The model's policy decides on ``view`` (default: the model as it stands); a policy
    that raises costs the request nothing (the plain engine, hard rules kept); no engine at
    all is a 503 (``where`` says among what, in its message)."""
    now = time.monotonic()
    if view is None:
        view = mrt.view(now)
    try:
        try:
            return mrt.policy.decide(features, view, now)
        except NoEngineAvailable:
            raise
        except Exception:  # a policy bug must not cost the request: plain engine, hard rules kept
            log.exception("routing policy failed; using the plain engine")
            d = _SAFE_POLICY.decide(features, view, now)
            return Decision(route=d.route, engine=d.engine, reason=Reason.POLICY_ERROR, fallback=d.fallback)
    except NoEngineAvailable as exc:
        raise ApiError(
            503,
            f"no engine can serve model '{model}'{where} right now ({exc.reason})",
            code="no_engine_available",
            headers={"Retry-After": "1"},
        ) from None
