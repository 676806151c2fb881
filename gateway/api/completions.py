"""``POST /v1/chat/completions`` and ``POST /v1/completions``: validate, decide, forward, learn."""

from __future__ import annotations

import asyncio
import logging
import time

from aiohttp import web
from multidict import CIMultiDict

from gateway.api.auth import check_client, check_model_access
from gateway.api.body import check_content_encoding, parse_body
from gateway.api.errors import ApiError, error_response
from gateway.api.features import CHAT, COMPLETIONS, model_name, parse_request
from gateway.api.headers import REASON, REQUEST_ID, ROUTE, request_id
from gateway.api.state import STATE, GatewayState
from gateway.engines.runtime import ModelRuntime
from gateway.proxy.forward import ProxyCall
from gateway.proxy.learning import learn_with_lookup, observe, wants_lookup
from gateway.routing.rules import NoEngineAvailable
from gateway.routing.static import FixedPolicy
from gateway.routing.types import Decision, Reason, RequestFeatures, Route
from gateway.telemetry.hooks import RequestTelemetry

log = logging.getLogger(__name__)


BODY_TIMEOUT_S = 30.0  # a client trickling its body must not hold a concurrency slot for ever


async def _read_body(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(413, f"request body exceeds {limit} bytes", code="request_too_large")
    check_content_encoding(request.headers.get("Content-Encoding"))
    try:
        if request.content.is_eof():  # the whole body already arrived: no timer needed
            return await request.read()
        async with asyncio.timeout(BODY_TIMEOUT_S):
            return await request.read()
    except TimeoutError:
        raise ApiError(
            408, f"request body not received within {BODY_TIMEOUT_S:g} s", code="request_timeout"
        ) from None
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, f"request body exceeds {limit} bytes", code="request_too_large") from None
    except web.RequestPayloadError:  # a body that does not decode as its Content-Encoding, or cut
        raise ApiError(
            400, "request body could not be read (does it match its Content-Encoding?)", code="invalid_body"
        ) from None


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _handle(request, CHAT)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _handle(request, COMPLETIONS)


async def _handle(request: web.Request, endpoint: str) -> web.StreamResponse:
    st = request.app[STATE]
    started = time.monotonic()
    rid = request_id(request.headers.get(REQUEST_ID))
    headers: CIMultiDict[str] = CIMultiDict({REQUEST_ID: rid})
    tel: RequestTelemetry | None = None
    model = "unknown"
    status = 500
    error: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    if st.draining:
        err = ApiError(
            503,
            "the gateway is shutting down; retry on another instance",
            code="shutting_down",
            headers={"Retry-After": "1", "Connection": "close"},
        )
        _telemetry(st, model, endpoint, rid, request).finished(503, error="shutting_down")
        return error_response(err, headers)
    if st.inflight >= st.config.server.max_concurrency:
        err = ApiError(
            429,
            "the gateway is at its concurrency limit; retry shortly",
            code="too_many_requests",
            headers={"Retry-After": "1"},
        )
        _telemetry(st, model, endpoint, rid, request).finished(429, error="concurrency_limit")
        return error_response(err, headers)
    st.inflight += 1
    counted: ModelRuntime | None = None
    try:
        server_keys = st.config.server.api_keys
        if st.client_keys and not st.open_models:
            check_client(request, st.client_keys)  # before reading the body
        raw = await _read_body(request, st.config.server.max_body_bytes)
        body = await parse_body(raw, st.config.server)
        name = model_name(body)
        mrt = st.models.get(name)
        check_model_access(
            request, name, None if mrt is None else mrt.config.api_keys, server_keys, st.client_keys
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
        mrt.inflight += 1
        counted = mrt
        model = name
        parsed = parse_request(
            body,
            endpoint,
            request.headers.get(ROUTE),
            allow_override=mrt.config.routing.allow_client_override,
        )
        tel = _telemetry(st, model, endpoint, rid, request)
        features = parsed.features
        t0 = time.perf_counter()
        decision = _decide(st, model, features)
        decision_s = time.perf_counter() - t0
        headers[ROUTE] = decision.route.value
        headers[REASON] = decision.reason
        try:
            tel.decided(features, decision, decision_s)
        except Exception:
            log.exception("telemetry decided failed")
        # Decide now whether this answer feeds the realised-lookup learning (bounded rate):
        # only then is its text collected, which costs a JSON parse per stream event.
        collect = bool(parsed.prompt_text) and st.lookup_budget(model).take()
        call = ProxyCall(
            request=request,
            body=parsed.body,
            endpoint=endpoint,
            client_model=model,
            stream=features.stream,
            include_usage=parsed.include_usage,
            decision=decision,
            model=mrt.config,
            engines=mrt.engines,
            pool=st.pool,
            telemetry=tel,
            request_id=rid,
            started=started,
            collect_text=collect,
            raw=raw,
            forward_headers=st.forward_headers,
        )
        result = await call.run()
        status = result.status
        error = result.error
        prompt_tokens = result.harvest.prompt_tokens
        completion_tokens = result.harvest.completion_tokens
        if collect and wants_lookup(result):
            st.spawn(learn_with_lookup(mrt, features, decision, result, parsed.prompt_text, started=started))
        else:
            observe(mrt, features, decision, result, started=started)
        return result.response
    except ApiError as exc:
        status, error = exc.status, exc.code or exc.type
        return error_response(exc, headers)
    except (asyncio.CancelledError, ConnectionResetError):
        status, error = 499, "client_disconnected"
        raise
    finally:
        if counted is not None:
            counted.inflight -= 1
        st.request_done()
        if tel is None:
            tel = _telemetry(st, model, endpoint, rid, request)
        try:
            tel.finished(
                status, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, error=error
            )
        except Exception:
            log.exception("telemetry finished failed")


def _telemetry(
    st: GatewayState, model: str, endpoint: str, rid: str, request: web.Request
) -> RequestTelemetry:
    return st.telemetry.start_request(model, endpoint, rid, request.headers)


_SAFE_POLICY = FixedPolicy(Route.BASE)


def _decide(st: GatewayState, model: str, features: RequestFeatures) -> Decision:
    mrt = st.models[model]
    now = time.monotonic()
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
            f"no engine can serve model '{model}' right now ({exc.reason})",
            code="no_engine_available",
            headers={"Retry-After": "1"},
        ) from None
