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


# What one event carries, as :meth:`Harvest.take` and :func:`token_kind` tell it: nothing,
# reasoning only, or content (text or a tool call; with or without reasoning beside it).
NO_TOKEN, REASONING, CONTENT = 0, 1, 2

_CONTENT_KEYS = (b'"content":"', b'"content": "', b'"text":"', b'"text": "')
_TOOL_KEYS = (b'"tool_calls":[{', b'"tool_calls": [{')
_REASONING_KEYS = (b'"reasoning_content":"', b'"reasoning_content": "', b'"reasoning":"', b'"reasoning": "')
REASONING_FIELDS = ("reasoning", "reasoning_content")  # vLLM's names, newer and older


def reasoning_of(part: dict[str, Any]) -> str | None:
    """The reasoning text of a delta or message: vLLM's ``reasoning``, else the older
    ``reasoning_content``. Releases between the rename and the old name's removal (and other
    servers) send both with the same text: it is one text, read once."""
    for key in REASONING_FIELDS:
        r = part.get(key)
        if isinstance(r, str) and r:
            return r
    return None


def _nonempty(data: bytes, keys: tuple[bytes, ...]) -> bool:
    """``data`` has one of ``keys`` followed by a non-empty string (an escaped key inside a
    JSON string, ``\\"content\\":``, never matches)."""
    for key in keys:
        i = data.find(key)
        while i >= 0:
            if data[i + len(key) : i + len(key) + 1] != b'"':
                return True
            i = data.find(key, i + len(key))
    return False


def token_kind(data: bytes) -> int:
    """What a stream chunk (its JSON text) carries, without parsing it: :data:`CONTENT`
    (non-empty ``delta.content``, completion ``text`` or a tool call), :data:`REASONING`
    (non-empty ``reasoning_content``/``reasoning`` only) or :data:`NO_TOKEN`."""
    if _nonempty(data, _CONTENT_KEYS) or any(k in data for k in _TOOL_KEYS):
        return CONTENT
    return REASONING if _nonempty(data, _REASONING_KEYS) else NO_TOKEN


def finishes(data: bytes) -> bool:
    """A chunk (JSON text) or events that carry a ``finish_reason`` or ``[DONE]``."""
    return any(k in data for k in (b'"finish_reason":"', b'"finish_reason": "', b"data: [DONE]"))


@dataclass(slots=True)
class Harvest:
    """What the gateway learns from a response as it passes through.

    A reasoning model's answer is its reasoning then its content: both are generated tokens
    (usage counts them alike, and a speculative engine's proposer drafts from both), so
    both count as tokens here (``token_events``, the first-token time) and both go into the
    completion text, in Qwen3's form ``<think>{reasoning}</think>{content}``, that the
    realised-lookup learning replays."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    content_events: int = 0  # events that carried a token of any kind (reasoning included)
    reasoning_events: int = 0
    reasoning_chars: int = 0
    content_chars: int = 0
    reported_reasoning_tokens: int | None = None  # usage.completion_tokens_details, if given
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

    @property
    def reasoning_tokens(self) -> int:
        """Reasoning tokens: the engine's count where usage reports one; else the completion
        tokens' share by characters (a speculative engine's delta may carry several tokens,
        so events undercount); else the reasoning events."""
        if self.reported_reasoning_tokens is not None:
            return self.reported_reasoning_tokens
        chars = self.reasoning_chars + self.content_chars
        if self.completion_tokens is not None and chars:
            return round(self.completion_tokens * self.reasoning_chars / chars)
        return self.reasoning_events

    def _reasoning(self, text: str) -> None:
        if not self.reasoning_chars:
            self.add_text("<think>")
        self.reasoning_chars += len(text)
        self.add_text(text)

    def _content(self, text: str) -> None:
        if self.reasoning_chars and not self.content_chars:
            self.add_text("</think>")
        self.content_chars += len(text)
        self.add_text(text)

    def take(self, obj: dict[str, Any]) -> int:
        """Inspect one response object (a stream chunk or a whole body): what it carried,
        :data:`CONTENT`, :data:`REASONING` or :data:`NO_TOKEN` (falsy)."""
        usage = obj.get("usage")
        if isinstance(usage, dict):
            # chat/completions name them prompt/completion, the Responses API input/output
            pt = usage.get("prompt_tokens", usage.get("input_tokens"))
            ct = usage.get("completion_tokens", usage.get("output_tokens"))
            if isinstance(pt, int):
                self.prompt_tokens = pt
            if isinstance(ct, int):
                self.completion_tokens = ct
            details = usage.get("completion_tokens_details")
            rt = details.get("reasoning_tokens") if isinstance(details, dict) else None
            if isinstance(rt, int) and not isinstance(rt, bool):
                self.reported_reasoning_tokens = rt
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
        kind = NO_TOKEN
        choices = obj.get("choices")
        if isinstance(choices, list):
            for c in choices:
                if isinstance(c, dict):
                    kind = max(kind, self._choice(c))
        if kind:
            self.content_events += 1
            if kind == REASONING:
                self.reasoning_events += 1
        return kind

    def _choice(self, c: dict[str, Any]) -> int:
        """What one choice (a delta, a message or a completion's text) carried."""
        part = c.get("delta")
        if not isinstance(part, dict):
            part = c.get("message")
        if not isinstance(part, dict):
            text = c.get("text")
            if isinstance(text, str) and text:
                self._content(text)
                return CONTENT
            return NO_TOKEN
        kind = NO_TOKEN
        r = reasoning_of(part)
        if r is not None:
            self._reasoning(r)
            kind = REASONING
        text = part.get("content")
        if isinstance(text, str) and text:
            self._content(text)
            kind = CONTENT
        if part.get("tool_calls"):
            kind = CONTENT
        return kind

    def _take_response(self, obj: dict[str, Any]) -> int:
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
        return CONTENT if got else NO_TOKEN


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


def error_event(message: str, code: int = 502, type_: str = "upstream_error") -> bytes:
    """A ``data:`` event carrying an error in OpenAI's shape (a stream that broke)."""
    return b"data: " + json.dumps(error_body(message, type_, code, None)).encode() + b"\n\n"
