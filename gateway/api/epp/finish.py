"""How the request of an ext_proc stream is finished: its slot released, its telemetry
counted and, for a watched answer whose body was read, the policy taught. From what the
stream showed of the response, or, where Envoy streams its access log to the EPP
(:mod:`gateway.api.epp.endings`), from the request's entry there.

A mixin of :class:`~gateway.api.epp.extproc.ExtProcStream`, which holds the state it reads.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from gateway.api.epp.endings import GRACE_S
from gateway.api.learning import learn_with_lookup, observe, wants_lookup
from gateway.envoy.accesslog import LogEntry

if TYPE_CHECKING:
    from gateway.api.epp.host import PickerServer
    from gateway.api.epp.observe import Observed
    from gateway.api.epp.pick import Picked
    from gateway.api.state import GatewayState

log = logging.getLogger(__name__)

# Envoy's response flags that say the engine failed the request (the engine's health)
_ENGINE_ERRORS = frozenset(
    {"upstream_reset", "upstream_timeout", "upstream_unavailable", "upstream_protocol_error"}
)


class Finish:
    server: PickerServer
    st: GatewayState
    picked: Picked | None
    observed: Observed | None
    watched: bool
    collect: bool
    deferred: bool
    closed: bool
    expecting: bool  # Envoy's access log will tell how the request ended
    entry: LogEntry | None  # its entry, when it came before the stream's end
    _aborted: bool

    @property
    def endpoints(self) -> str:
        return self.picked.endpoints if self.picked is not None else ""

    def _close(self, *, aborted: bool) -> None:
        if self.closed:
            return
        self.closed = True
        p, obs = self.picked, self.observed
        if p is None:
            return
        if self.expecting:
            # The response goes on after the stream where the body went without waiting: one
            # trip (Envoy resets the stream once the request is answered) and full duplex
            # (ended, or reset, once the response headers came).
            running = self.deferred and (not aborted or obs is not None)
            known = obs is not None and obs.status != 0
            if running or not known:
                if self.entry is not None:  # the access log came first
                    self._logged_end(self.entry)
                    return
                if not running:
                    p.release()
                due = p.started + p.model.config.timeouts.total_s if running else time.monotonic() + GRACE_S
                self._aborted = aborted
                self.server.endings.wait(p.rid, self, due)
                return
            self.server.endings.forget(p.rid, self)
        self._stream_end(aborted)

    def logged(self, entry: LogEntry) -> None:
        """Envoy's access log entry for this request (:mod:`gateway.api.epp.endings`)."""
        if self.closed:
            self._logged_end(entry)
        else:  # the stream ends later: its end reads the entry
            self.entry = entry

    def missed(self) -> None:
        """The access log did not tell how this request ended: finished without it."""
        self._stream_end(self._aborted)

    def _logged_end(self, entry: LogEntry) -> None:
        p, obs = self.picked, self.observed
        assert p is not None
        if entry.upstream:
            engine = self.server.book.engine_at(entry.upstream)
            if engine is not None and engine is not p.engine:
                p.move_to(engine)
        p.release()
        status, error = entry.status, entry.error
        if error == "client_disconnected":
            status = 499
        elif status == 0:  # reset before any response
            status, error = 502, error or "upstream_reset"
        elif error is None and status >= 400:
            error = f"status_{status}"
        if obs is None and entry.upstream:  # the engine's health, as the watched answers tell it
            if entry.details == "via_upstream" and status >= 500:
                p.engine.record_failure(f"status_{status}")
            elif error in _ENGINE_ERRORS:
                p.engine.record_failure(error)
            elif status < 500:
                p.engine.record_success()
        self._finished(p, status, None, None, error, duration_s=entry.duration_s)

    def _stream_end(self, aborted: bool) -> None:
        """Finish the request from what its ext_proc stream showed."""
        p, obs = self.picked, self.observed
        assert p is not None
        p.release()
        status, error = (obs.status if obs is not None else 0), None
        if status:
            error = None if obs is not None and obs.ok else f"status_{status}"
        elif aborted:
            status, error = 499, "client_disconnected"
        elif self.watched:  # the response ended without its headers reaching the EPP
            status, error = 502, "status_502"
        # else: not watched, Envoy relayed an answer the EPP did not see (status 0)
        if obs is None:  # no response phase: nothing was read
            self._finished(p, status, None, None, error)
            return
        if aborted and obs.reading and not obs.complete:
            error = "client_disconnected"
        h = obs.harvest
        if h.reasoning_events:
            p.tel.reasoning_tokens(h.reasoning_tokens)
        self._finished(p, status, h.prompt_tokens, h.completion_tokens, error)
        if not (obs.reading and obs.complete and obs.ok):
            return
        features, decision = p.parsed.features, p.decision
        if self.collect and wants_lookup(obs):
            self.st.spawn(
                learn_with_lookup(
                    p.model,
                    features,
                    decision,
                    obs,
                    p.parsed.prompt_text,
                    started=p.started,
                    advice=self.st.advice_for(p.model.name),
                )
            )
        else:
            observe(p.model, features, decision, obs, started=p.started)

    @staticmethod
    def _finished(
        p: Picked,
        status: int,
        prompt_tokens: int | None,
        completion_tokens: int | None,
        error: str | None,
        *,
        duration_s: float | None = None,
    ) -> None:
        try:
            p.tel.finished(
                status,
                prompt_tokens=prompt_tokens,
                completion_tokens=completion_tokens,
                error=error,
                duration_s=duration_s,
            )
        except Exception:
            log.exception("telemetry finished failed")
