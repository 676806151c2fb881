"""One ext_proc stream: one client request as Envoy shows it to the Endpoint Picker.

Envoy sends the request's headers, then its body; the EPP answers with the engine's address
(:mod:`gateway.api.epp.pick`), or with an immediate error response. Three body modes:

- BUFFERED: the headers are answered at once; the whole body follows and its answer routes.
- STREAMED: the body's pieces are kept until the last. With
  ``send_body_without_waiting_for_header_response`` they come before the headers are
  answered, so the headers' answer waits for the last piece and routes, then each piece is
  answered.
- FULL_DUPLEX_STREAMED: as the last, and the body goes back in one piece.

Where the body is sent without waiting in STREAMED mode (one round trip, no response phase),
Envoy resets the stream once the request is answered: the EPP never sees such a response
end, and releases the request's slot at routing, unless Envoy's access log tells it the end
(:mod:`gateway.api.epp.finish`).

A bounded share of requests is *watched*: the answer to their headers asks Envoy for their
response headers too (a mode override; the bootstrap ``specgate envoy-config`` writes skips
them otherwise, and Envoy adds the route headers from the EPP's metadata). Envoy ignores the
override where the body is sent without waiting for the headers' answer: there only the
filter's own modes say whether the response phase comes. A watched response's status, the engine that
served it and, for a sampled few, its body chunk by chunk (:mod:`gateway.api.epp.observe`)
come to the EPP. Envoy ends the stream when the response ends: the request is then finished
(:mod:`gateway.api.epp.finish`: its slots released, its telemetry reported and, when its
body was read, the policy taught). In full
duplex mode Envoy honours no mode override: its config must send the response headers
(Envoy ends the stream only after them).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from multidict import CIMultiDict

from gateway.api.body import check_content_encoding, decoded, parse_body, parse_inline
from gateway.api.epp.finish import Finish
from gateway.api.epp.host import PickerServer
from gateway.api.epp.observe import Observed
from gateway.api.epp.pick import ClientRequest, Picked, admit, endpoint_of, passthrough, subset_of
from gateway.api.learning import SampleBudget
from gateway.envoy import messages as m
from gateway.envoy.protowire import ProtoError
from gateway.wire.errors import ApiError
from gateway.wire.headers import ENGINE, REASON, REQUEST_ID, ROUTE, request_id

if TYPE_CHECKING:
    from gateway.envoy.h2stream import Stream

log = logging.getLogger(__name__)

_INLINE_BYTES = 256 * 1024  # larger (or encoded) bodies are decoded and parsed off the loop


class ExtProcStream(Finish):
    """The :class:`~gateway.envoy.h2.StreamHandler` of one ``ExternalProcessor/Process`` call."""

    def __init__(self, server: PickerServer, stream: Stream) -> None:
        self.server = server
        self.st = server.state
        self.stream = stream
        self.req: ClientRequest | None = None
        self.endpoint: str | None = None  # CHAT / COMPLETIONS; None: not an inference
        self.body_mode = m.BUFFERED  # the filter's request body mode
        self.deferred = False  # the body comes before the headers are answered
        self.held = 0  # pieces of the body not answered yet (the headers' answer comes first)
        self.watched = False  # the response headers come to the EPP
        self.passthrough: str | None = None  # the engine of a request that is not an inference
        self._body = bytearray()
        self.picked: Picked | None = None
        self.observed: Observed | None = None
        self.collect = False
        self.status = 0
        self.error: str | None = None
        self.closed = False
        self.model_label = "unknown"  # the telemetry label of a refused request
        self.expecting = False  # see :class:`~gateway.api.epp.finish.Finish`
        self.entry = None
        self._aborted = False

    @property
    def full_duplex(self) -> bool:
        return self.body_mode == m.FULL_DUPLEX_STREAMED

    @property
    def one_trip(self) -> bool:
        """STREAMED with the body sent without waiting: one round trip, no response phase."""
        return self.deferred and not self.full_duplex

    # -- StreamHandler -----------------------------------------------------------------
    def on_message(self, message: bytes) -> None:
        try:
            inc = m.parse(message)
        except ProtoError:
            self.stream.abort(3, "undecodable ProcessingRequest")
            return
        kind = inc.kind
        if kind == m.REQUEST_HEADERS:
            self._request_headers(inc)
        elif kind == m.REQUEST_BODY:
            self._request_body(inc)
        elif kind == m.RESPONSE_HEADERS:
            self._response_headers(inc)
        elif kind == m.RESPONSE_BODY:
            if self.observed is not None and self.observed.reading:
                self._observe_chunk(inc.body, inc.end_of_stream)
            self.stream.send(m.CONTINUE_RESPONSE_BODY)
        elif kind in m.CONTINUE_TRAILERS:
            self.stream.send(m.CONTINUE_TRAILERS[kind])
        else:
            self.stream.abort(12, f"unsupported ProcessingRequest {kind or 'empty'}")

    def on_end(self) -> None:
        self.stream.finish()
        self._close(aborted=False)

    def on_reset(self) -> None:
        # With the body sent without waiting (STREAMED), Envoy resets the stream as soon as
        # the request is answered: it sends nothing more there, and the response's end is
        # never shown. After the routing that is the end of the EPP's part, not a
        # disconnect: the request is counted unobserved and its slot released here.
        self._close(aborted=not (self.one_trip and self.picked is not None))

    @property
    def awaiting(self) -> bool:
        """Before the request is routed or refused Envoy owes the next message; after, the
        stream lasts as long as the response, however long that is (the slot's bound is
        :meth:`overdue`)."""
        return self.picked is None and self.passthrough is None and not self.status

    def overdue(self, now: float) -> bool:
        """The request has held its slot past its model's ``timeouts.total_s`` (Envoy did not
        end the stream): the slot is released, the stream left to Envoy."""
        p = self.picked
        if p is None or p.released or now - p.started <= p.model.config.timeouts.total_s:
            return False
        log.warning(
            "EPP: a request held its slot on %s for over %.0f s (timeouts.total_s) without Envoy "
            "ending its stream; releasing the slot",
            p.engine.name,
            p.model.config.timeouts.total_s,
            extra={"throttle_key": "epp_overdue"},
        )
        p.release()
        return True

    # -- request ------------------------------------------------------------------------
    def _request_headers(self, inc: m.Incoming) -> None:
        h = inc.headers
        self.body_mode = inc.body_mode
        self.deferred = inc.full_duplex or (inc.body_mode == m.STREAMED and inc.body_without_waiting)
        headers: CIMultiDict[str] = CIMultiDict([(k, v) for k, v in h.items() if k[:1] != ":"])
        self.req = ClientRequest(headers, request_id(h.get(REQUEST_ID)), subset_of(inc.metadata))
        method = h.get(":method", "")
        self.endpoint = endpoint_of(h.get(":path", "")) if method == "POST" else None
        if self.endpoint is None:
            try:
                self.passthrough, addr = passthrough(self.st, self.server.book, self.req.subset)
            except ApiError as exc:
                self._refuse(exc)
                return
            self.stream.send(
                m.routed(m.REQUEST_HEADERS, addr, {}, None, {"route": "base", "reason": "not_inference"})
            )
            return
        if inc.end_of_stream:
            self._refuse(ApiError(400, "the request has no body", code="invalid_body"))
            return
        length = h.get("content-length")
        limit = self.st.config.server.max_body_bytes
        if length is not None and length.isdigit() and int(length) > limit:
            self._refuse(ApiError(413, f"request body exceeds {limit} bytes", code="request_too_large"))
            return
        # Where the body comes without waiting, Envoy ignores mode overrides: in full duplex
        # mode its config must send the response headers; else they come if it does.
        self.watched = self.full_duplex or (not self.deferred and self.server.watch())
        if not self.deferred:
            self.stream.send(m.continue_headers(watch=self.watched, body_mode=inc.body_mode))

    def _request_body(self, inc: m.Incoming) -> None:
        if self.passthrough is not None:  # not an inference: the body passes as it is
            if self.full_duplex:
                self.stream.send(m.full_duplex_chunk(inc.body, inc.end_of_stream))
            else:
                self.stream.send(m.CONTINUE_BODY)
            return
        if self.req is None or self.picked is not None or self.status:
            self.stream.abort(9, "request body out of order")
            return
        if self._body or not inc.end_of_stream:
            if not self.stream.hold(len(inc.body)):  # over the EPP's memory bounds: the stream ended
                return
            self._body += inc.body
            size = len(self._body)
        else:  # the whole body in one message (BUFFERED): taken as it is
            size = len(inc.body)
        limit = self.st.config.server.max_body_bytes
        if size > limit:
            self._refuse(ApiError(413, f"request body exceeds {limit} bytes", code="request_too_large"))
            return
        if not inc.end_of_stream:
            if self.deferred:  # answered after the headers, once the last piece routed
                self.held += not self.full_duplex
            else:  # STREAMED: each piece is answered; the body is kept
                self.stream.send(m.CONTINUE_BODY)
            return
        if self._body:
            raw = bytes(self._body)
            self._body = bytearray()
            self.stream.uncharge(len(raw))
        else:
            raw = inc.body
        coding = self.req.headers.get("content-encoding")
        try:
            check_content_encoding(coding)
        except ApiError as exc:
            self._refuse(exc)
            return
        if len(raw) <= _INLINE_BYTES and not coding:
            try:
                body = parse_inline(raw, self.st.config.server)
            except ApiError as exc:
                self._refuse(exc)
                return
            self._route(body, raw, decoded_body=False)
        else:
            self.st.spawn(self._route_later(raw, coding))

    async def _route_later(self, raw: bytes, coding: str | None) -> None:
        server = self.st.config.server
        try:
            plain = await decoded(raw, coding, server.max_body_bytes)
            body = await parse_body(plain, server)
        except ApiError as exc:
            if not self.stream.finished:
                self._refuse(exc)
            return
        if self.stream.finished:  # Envoy gave up meanwhile
            return
        self._route(body, plain, decoded_body=plain is not raw)

    def _route(self, body: dict[str, Any], raw: bytes, *, decoded_body: bool) -> None:
        assert self.req is not None and self.endpoint is not None
        name = body.get("model")
        if isinstance(name, str) and name in self.st.models:
            self.model_label = name
        try:
            p = admit(self.st, self.server.book, self.req, self.endpoint, body, raw)
        except ApiError as exc:
            self._refuse(exc)
            return
        self.picked = p
        self.expecting = self.server.endings.expect(p.rid, self, self.stream.conn.peer_host)
        new_body = p.body if p.body is not None else (raw if decoded_body else None)
        headers = p.set_headers
        tags = {"route": p.decision.route.value, "reason": str(p.decision.reason), "engine": p.engine.name}
        if not self.deferred:
            self.stream.send(m.routed(m.REQUEST_BODY, p.endpoints, headers, new_body, tags))
            return
        replaced = new_body is not None
        routed = m.routed(m.REQUEST_HEADERS, p.endpoints, headers, None, tags, new_length=replaced)
        if self.full_duplex:
            self.stream.send(routed)
            self.stream.send(m.full_duplex_chunk(new_body if new_body is not None else raw, True))
            return
        # STREAMED, the body sent without waiting: the headers' answer, then one per piece (a
        # new body replaces the last piece, the earlier ones dropped).
        self.stream.send(routed)
        for _ in range(self.held):
            self.stream.send(m.body_chunk(None, clear=replaced))
        self.held = 0
        self.stream.send(m.body_chunk(new_body))

    def _refuse(self, exc: ApiError) -> None:
        """Envoy answers the client with this error; the request reaches no engine."""
        self.status, self.error = exc.status, exc.code or exc.type
        rid = self.req.rid if self.req is not None else request_id(None)
        self.stream.send(m.immediate(exc, {REQUEST_ID: rid}))
        if self.endpoint is not None and self.req is not None:  # an inference request: count it
            try:
                self.st.telemetry.start_request(
                    self.model_label, self.endpoint, rid, self.req.headers
                ).finished(exc.status, error=self.error)
            except Exception:
                log.exception("telemetry failed")

    # -- response -----------------------------------------------------------------------
    def _response_headers(self, inc: m.Incoming) -> None:
        p = self.picked
        if p is None:  # not routed by specgate (a passthrough): nothing to add
            self.stream.send(m.CONTINUE_RESPONSE_HEADERS)
            return
        obs = self.observed
        if obs is None:  # made when the response shows up (most answers' never do)
            obs = self.observed = Observed(p.engine.name, p.engine.route, p.parsed.features.stream)
        status = int(inc.headers.get(":status", "0") or 0)
        obs.status = status
        obs.ok = 200 <= status < 300
        served = inc.metadata.get(m.LB_NAMESPACE, {}).get(m.SERVED)
        if isinstance(served, str):
            engine = self.server.book.engine_at(served.split(",")[0])
            if engine is not None and engine is not p.engine:
                p.move_to(engine)
                obs.engine, obs.route, obs.retried = engine.name, engine.route, True
        engine = p.engine
        if status >= 500:
            engine.record_failure(f"status_{status}")
        elif status:
            engine.record_success()
        p.tel.upstream_first_byte(engine.name)
        read = obs.ok and self.server.sample(p.model.name)
        if read:
            obs.reading = True
            self.collect = bool(p.parsed.prompt_text) and self.st.lookup_budget(p.model.name).take()
            obs.harvest.collect_text = self.collect
        added = {
            ROUTE: engine.route.value,
            REASON: str(p.decision.reason) if engine is p.chosen else "failover",
            ENGINE: engine.name,
            REQUEST_ID: p.rid,
        }
        self.stream.send(m.response_headers(added, read_body=read))

    def _observe_chunk(self, chunk: bytes, end: bool) -> None:
        obs, p = self.observed, self.picked
        assert obs is not None and p is not None
        had_token, had_content = obs.first_token_at is not None, obs.first_content_at is not None
        obs.feed(chunk, end)
        if not had_token and obs.first_token_at is not None:
            p.tel.first_token()
        if not had_content and obs.first_content_at is not None:
            p.tel.first_content()


def budget(rate: float) -> SampleBudget:
    """A model's budget of answers whose body the EPP reads (``epp.observe_per_s``)."""
    return SampleBudget(rate=rate, burst=max(1.0, rate))
