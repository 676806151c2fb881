"""The response phase of the Endpoint Picker: what it learns of an answer Envoy relayed.

Every answer's end is known (Envoy ends the ext_proc stream when the response ends), so
in-flight counts and the request's telemetry are exact. Its body is read only for a
bounded rate of answers per model (``epp.observe_per_s``): those give the policy its
outcome (tokens, time per token, vLLM's per-request speculative metrics) and, where
sampled, the text for the n-gram replay. Reading a stream costs one message per chunk.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from gateway.proxy.sse import CONTENT, NO_TOKEN, Harvest
from gateway.routing.types import Route

MAX_EVENT_BYTES = 1 << 20  # a stream event larger than this ends the observation
MAX_BODY_BYTES = 8 << 20  # a non-streamed answer larger than this is not parsed


@dataclass(slots=True)
class Observed:
    """What the EPP saw of one answer; learning reads it as it reads the proxy's result
    (:class:`gateway.api.learning.Relayed`)."""

    engine: str | None
    route: Route | None
    stream: bool
    ok: bool = False
    status: int = 0
    retried: bool = False
    moved: bool = False
    harvest: Harvest = field(default_factory=Harvest)
    first_token_at: float | None = None  # the first token of any kind (reasoning, content, tool call)
    first_content_at: float | None = None
    last_token_at: float | None = None
    reading: bool = False  # the body is being read
    complete: bool = False  # the body was read to its end
    _buf: bytearray = field(default_factory=bytearray)
    _broken: bool = False

    def feed(self, chunk: bytes, end: bool, now: float | None = None) -> None:
        """One piece of the response body (``end``: the last)."""
        if self._broken:
            return
        now = time.monotonic() if now is None else now
        buf = self._buf
        buf += chunk
        if self.stream:
            self._events(now)
            if len(buf) > MAX_EVENT_BYTES:
                self._stop()
        elif len(buf) > MAX_BODY_BYTES:
            self._stop()
        if end and not self._broken:
            if not self.stream:
                self._whole(now)
            self.complete = True

    def _stop(self) -> None:
        self._broken = True
        self._buf = bytearray()

    def _events(self, now: float) -> None:
        buf = self._buf
        start = 0
        while True:
            cut = buf.find(b"\n\n", start)
            if cut < 0:
                break
            event = bytes(buf[start:cut])
            start = cut + 2
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if not data or data == b"[DONE]":
                    continue
                self._take(data, now)
        if start:
            del buf[:start]

    def _whole(self, now: float) -> None:
        self._take(bytes(self._buf), now)
        self._buf = bytearray()

    def _take(self, data: bytes, now: float) -> None:
        try:
            obj = json.loads(data)
        except ValueError:
            return
        kind = self.harvest.take(obj) if isinstance(obj, dict) else NO_TOKEN
        if kind and self.stream:
            if self.first_token_at is None:
                self.first_token_at = now
            if kind == CONTENT and self.first_content_at is None:
                self.first_content_at = now
            self.last_token_at = now
