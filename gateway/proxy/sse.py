"""Server-sent events as vLLM emits them: split, inspect and rewrite, event by event."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any

from gateway.wire.errors import error_body

DONE = b"data: [DONE]\n\n"
MAX_COMPLETION_CHARS = 32 * 1024  # completion text kept for learning


Patterns = tuple[tuple[bytes, bytes], ...]


@functools.lru_cache(maxsize=256)  # both names come from the configuration: few pairs
def model_patterns(served: str, client: str) -> Patterns:
    """Byte patterns of the ``model`` field as JSON encoders write it, and their replacement."""
    s, c = json.dumps(served), json.dumps(client)
    return (
        (f'"model":{s}'.encode(), f'"model":{c}'.encode()),
        (f'"model": {s}'.encode(), f'"model": {c}'.encode()),
    )


def rewrite_model(data: bytes, patterns: Patterns, obj: dict[str, Any], client: str) -> bytes:
    """``data`` (the JSON text of ``obj``) with the top-level model renamed to ``client``."""
    if "model" not in obj:
        return data
    for old, new in patterns:
        if old in data:
            return data.replace(old, new, 1)
    obj["model"] = client
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


@dataclass(slots=True)
class Harvest:
    """What the gateway learns from a response as it passes through."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    content_events: int = 0
    text_parts: list[str] = field(default_factory=list)
    text_chars: int = 0
    reported_acceptance_rate: float | None = None
    reported_mean_acceptance_length: float | None = None
    error: str | None = None
    # Keep the completion text (for the realised-lookup learning signal); when off, streams
    # take a fast path that does not parse content chunks.
    collect_text: bool = True

    def add_text(self, text: str) -> None:
        if self.collect_text and text and self.text_chars < MAX_COMPLETION_CHARS:
            part = text[: MAX_COMPLETION_CHARS - self.text_chars]
            self.text_parts.append(part)
            self.text_chars += len(part)

    @property
    def completion_text(self) -> str:
        return "".join(self.text_parts)

    def take(self, obj: dict[str, Any]) -> bool:
        """Inspect one response object (a stream chunk or a whole body). True if it carried content."""
        usage = obj.get("usage")
        if isinstance(usage, dict):
            # chat/completions name them prompt/completion, the Responses API input/output
            pt = usage.get("prompt_tokens", usage.get("input_tokens"))
            ct = usage.get("completion_tokens", usage.get("output_tokens"))
            if isinstance(pt, int):
                self.prompt_tokens = pt
            if isinstance(ct, int):
                self.completion_tokens = ct
        metrics = obj.get("metrics")
        if isinstance(metrics, dict):
            sd = metrics.get("speculative_decoding")
            if isinstance(sd, dict):
                rate, al = sd.get("draft_acceptance_rate"), sd.get("mean_acceptance_length")
                if isinstance(rate, int | float) and not isinstance(rate, bool):
                    self.reported_acceptance_rate = float(rate)
                if isinstance(al, int | float) and not isinstance(al, bool):
                    self.reported_mean_acceptance_length = float(al)
        err = obj.get("error")
        if err is not None:
            self.error = "engine_error"
        if isinstance(obj.get("output"), list):  # a Responses API object
            return self._take_response(obj)
        got = False
        choices = obj.get("choices")
        if isinstance(choices, list):
            for c in choices:
                if not isinstance(c, dict):
                    continue
                text: Any = None
                delta = c.get("delta")
                if isinstance(delta, dict):
                    text = delta.get("content")
                else:
                    msg = c.get("message")
                    text = msg.get("content") if isinstance(msg, dict) else c.get("text")
                if isinstance(text, str) and text:
                    got = True
                    self.add_text(text)
        if got:
            self.content_events += 1
        return got

    def _take_response(self, obj: dict[str, Any]) -> bool:
        """The output text of a whole Responses API object (its message items)."""
        got = False
        for item in obj["output"]:
            message = isinstance(item, dict) and item.get("type") == "message"
            content = item.get("content") if message else None
            for part in content if isinstance(content, list) else ():
                if not isinstance(part, dict) or part.get("type") != "output_text":
                    continue
                text = part.get("text")
                if isinstance(text, str) and text:
                    got = True
                    self.add_text(text)
        if got:
            self.content_events += 1
        return got


# Responses API stream events (``event: <type>`` + ``data: {"type": <type>, ...}``).
_RESPONSE_TEXT = "response.output_text.delta"
_RESPONSE_TOKENS = frozenset({_RESPONSE_TEXT, "response.reasoning_text.delta", "response.refusal.delta"})
_RESPONSE_END = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})


def responses_event(ev: bytes, client: str, harvest: Harvest) -> tuple[bytes, bool, bool]:
    """One Responses API stream event → (bytes to send, the stream ended, it carried a token).

    The events that carry the response object (``response.created`` ... ``response.completed``)
    get its ``model`` renamed to the client's and give their usage; text deltas feed the
    harvest; ``response.failed`` and ``error`` mark the answer failed. The stream ends at its
    last event (``response.completed``, ``.incomplete``, ``.failed``, ``error``), or at a
    ``[DONE]`` some servers add."""
    at = 0 if ev.startswith(b"data:") else ev.find(b"\ndata:") + 1  # the first data line
    if at == 0 and not ev.startswith(b"data:"):
        return ev + b"\n\n", False, False
    head, data = ev[:at], ev[at + 5 :].strip()
    if data == b"[DONE]":
        return DONE, True, False
    try:
        obj = json.loads(data)
    except ValueError:
        return ev + b"\n\n", False, False
    if not isinstance(obj, dict):
        return ev + b"\n\n", False, False
    kind = obj.get("type")
    ended = kind in _RESPONSE_END
    if kind in ("response.failed", "error"):
        harvest.error = "engine_error"
    if kind in _RESPONSE_TOKENS:
        delta = obj.get("delta")
        if kind == _RESPONSE_TEXT and isinstance(delta, str):
            harvest.add_text(delta)
        harvest.content_events += 1
        return ev + b"\n\n", ended, True
    response = obj.get("response")
    if not isinstance(response, dict):
        return ev + b"\n\n", ended, False
    usage = response.get("usage")
    if isinstance(usage, dict):
        harvest.take({"usage": usage})
    if "model" in response:
        response["model"] = client
    out = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
    return head + b"data: " + out + b"\n\n", ended, False


def slow_event(data: bytes) -> bool:
    """The event may carry usage, an error or per-request metrics: parse it (no generator:
    this runs for every event of every stream)."""
    return b'"usage"' in data or b'"error"' in data or b'"metrics"' in data


_CONTENT_KEYS = (b'"content":"', b'"content": "', b'"text":"', b'"text": "')


def has_content(data: bytes) -> bool:
    """The chunk carries a non-empty ``delta.content`` (chat) or ``text`` (completions)."""
    for key in _CONTENT_KEYS:
        i = data.find(key)
        if i >= 0 and data[i + len(key) : i + len(key) + 1] != b'"':
            return True
    return False


def error_event(message: str, code: int = 502, type_: str = "upstream_error") -> bytes:
    """A ``data:`` event carrying an error in OpenAI's shape (a stream that broke)."""
    return b"data: " + json.dumps(error_body(message, type_, code, None)).encode() + b"\n\n"
