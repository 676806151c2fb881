"""An OpenAI request body (already decoded JSON) → validated routing features.

Only what the gateway relies on is checked (types and ranges of the sampling parameters
it reads, presence of messages/prompt); every other field passes through untouched to
the engine, which stays the authority on the rest of the schema. The prompt text is the
messages' text joined in order; the overlap predictor's instruction is the last *user*
message (chat) or the prompt (completions). A Responses API request (``/v1/responses``)
is read the same way: ``instructions`` then the text of its ``input`` items form the
prompt, the last user item is the instruction, ``max_output_tokens`` bounds the answer.
"""

from __future__ import annotations

import logging
import math
import zlib
from dataclasses import dataclass
from typing import Any

from gateway.routing.overlap import predict_overlap
from gateway.routing.types import RequestFeatures, Route, RouteOverride

log = logging.getLogger(__name__)

CHAT = "chat"
COMPLETIONS = "completions"
RESPONSES = "responses"
MAX_PROMPT_TEXT = 256 * 1024  # characters of prompt text kept for overlap prediction/learning


@dataclass(slots=True)
class ParsedRequest:
    body: dict[str, Any]
    model: str
    endpoint: str  # CHAT | COMPLETIONS | RESPONSES
    features: RequestFeatures
    prompt_text: str
    include_usage: bool  # the client asked for the final usage chunk


class BadRequest(ValueError):
    """The body (or the route header) is invalid: the gateway answers 400 ``invalid_value``."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def _bad(param: str, msg: str) -> BadRequest:
    return BadRequest(f"'{param}' {msg}", param)


def _number(body: dict[str, Any], key: str, lo: float, hi: float, default: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise _bad(key, f"must be a number, got {type(v).__name__}")
    f = float(v)
    if not math.isfinite(f) or not lo <= f <= hi:
        raise _bad(key, f"must be between {lo:g} and {hi:g}, got {v!r}")
    return f


def _int(body: dict[str, Any], key: str, lo: int, hi: int) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(key, f"must be an integer, got {type(v).__name__}")
    if not lo <= v <= hi:
        raise _bad(key, f"must be between {lo} and {hi}, got {v}")
    return v


def _bool(body: dict[str, Any], key: str) -> bool:
    v = body.get(key)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise _bad(key, f"must be a boolean, got {type(v).__name__}")
    return v


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict):
                raise _bad(f"{where}[{i}]", "must be a content part object")
            text = part.get("text")
            if part.get("type") == "text":
                if not isinstance(text, str):
                    raise _bad(f"{where}[{i}].text", "must be a string")
                parts.append(text)
        return "\n".join(parts)
    raise _bad(where, "must be a string or a list of content parts")


def _chat_text(body: dict[str, Any]) -> tuple[str, str]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "is required and must be a non-empty array")
    texts: list[str] = []
    last_user = ""
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise _bad(f"messages[{i}]", "must be an object")
        role = m.get("role")
        if not isinstance(role, str) or not role:
            raise _bad(f"messages[{i}].role", "is required and must be a string")
        text = _content_text(m.get("content"), f"messages[{i}].content")
        texts.append(text)
        if role == "user":
            last_user = text
    return "\n".join(texts), last_user


_INPUT_TEXT = frozenset({"input_text", "output_text", "text"})


def _item_text(item: Any, where: str) -> tuple[str, str | None]:
    """(text, role) of one Responses ``input`` item: a message's text parts; the output of
    a tool call; nothing for the other item kinds (the engine checks those)."""
    if not isinstance(item, dict):
        raise _bad(where, "must be an object")
    role = item.get("role")
    if role is not None and not isinstance(role, str):
        raise _bad(f"{where}.role", "must be a string")
    content = item.get("content")
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict):
                raise _bad(f"{where}.content[{i}]", "must be a content part object")
            text = part.get("text")
            if part.get("type") in _INPUT_TEXT:
                if not isinstance(text, str):
                    raise _bad(f"{where}.content[{i}].text", "must be a string")
                parts.append(text)
        return "\n".join(parts), role
    if content is not None:
        return _content_text(content, f"{where}.content"), role
    output = item.get("output")
    return (output if isinstance(output, str) else ""), role


def _responses_text(body: dict[str, Any]) -> tuple[str, str]:
    """(prompt text, instruction) of a Responses API request."""
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _bad("instructions", "must be a string")
    texts = [instructions] if instructions else []
    given = body.get("input")
    if isinstance(given, str) and given:
        return "\n".join([*texts, given]), given
    if not isinstance(given, list) or not given:
        raise _bad("input", "is required: a string or a non-empty array of input items")
    last_user = ""
    for i, item in enumerate(given):
        text, role = _item_text(item, f"input[{i}]")
        texts.append(text)
        if role == "user":
            last_user = text
    return "\n".join(texts), last_user


def _completion_text(body: dict[str, Any]) -> tuple[str, int | None]:
    """(prompt text, token count when the prompt is token ids)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return "\n".join(prompt), None
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return "", len(prompt)
        if all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in prompt):
            return "", sum(len(p) for p in prompt)
    raise _bad("prompt", "is required: a string, an array of strings, or token ids")


def model_name(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model", "is required and must be a string")
    return model


AFFINITY_CHARS = 1024  # a conversation's opening: what its later turns repeat


def affinity_of(body: dict[str, Any], prompt_text: str) -> int:
    """A conversation's key (``RequestFeatures.affinity``): its ``user``, else its opening."""
    user = body.get("user")
    key = user if isinstance(user, str) and user else prompt_text[:AFFINITY_CHARS]
    return (zlib.crc32(key.encode("utf-8", "replace")) or 1) if key else 0


def parse_request(
    body: dict[str, Any],
    endpoint: str,
    route_header: str | None,
    *,
    allow_override: bool,
) -> ParsedRequest:
    """Validate a parsed body and extract features; raises :class:`BadRequest` on bad input."""
    model = model_name(body)
    if endpoint == CHAT:
        prompt_text, instruction = _chat_text(body)
        prompt_tokens = None
    elif endpoint == RESPONSES:
        prompt_text, instruction = _responses_text(body)
        prompt_tokens = None
        if body.get("previous_response_id") is not None:
            raise _bad(
                "previous_response_id",
                "is not supported through the gateway: a stored response lives on one engine, "
                "and the next request may be routed to the other; send the conversation in 'input'",
            )
    else:
        prompt_text, prompt_tokens = _completion_text(body)
        instruction = prompt_text

    temperature = _number(body, "temperature", 0.0, 2.0, 1.0)
    top_p = _number(body, "top_p", 0.0, 1.0, 1.0)
    if body.get("top_p") is not None and top_p <= 0.0:
        raise _bad("top_p", "must be greater than 0")
    _number(body, "presence_penalty", -2.0, 2.0, 0.0)
    _number(body, "frequency_penalty", -2.0, 2.0, 0.0)
    _number(body, "repetition_penalty", 0.0, 100.0, 1.0)
    min_p = _number(body, "min_p", 0.0, 1.0, 0.0)
    _int(body, "top_k", -1, 1 << 20)
    _int(body, "seed", -(1 << 63), (1 << 64) - 1)
    n = _int(body, "n", 1, 128) or 1
    max_tokens = _int(body, "max_tokens", 1, 1 << 24)
    mct = _int(body, "max_completion_tokens", 1, 1 << 24)
    if mct is not None:
        max_tokens = mct if max_tokens is None else min(max_tokens, mct)
    if endpoint == RESPONSES:
        max_tokens = _int(body, "max_output_tokens", 1, 1 << 24)
    stream = _bool(body, "stream")
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, dict):
        raise _bad("stream_options", "must be an object")
    # A Responses stream always ends with its usage (in ``response.completed``).
    asked_usage = bool(stream_options and stream_options.get("include_usage") is True)
    include_usage = endpoint == RESPONSES or asked_usage
    logit_bias = body.get("logit_bias")
    if logit_bias is not None and not isinstance(logit_bias, dict):
        raise _bad("logit_bias", "must be an object mapping token ids to biases")
    stop = body.get("stop")
    if stop is not None and not (
        isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise _bad("stop", "must be a string or an array of strings")

    refused: list[str] = []
    if min_p > 0.0:
        refused.append("min_p")
    if logit_bias:
        refused.append("logit_bias")

    forced: Route | None = None
    if route_header is not None:
        try:
            override = RouteOverride(route_header.strip().lower())
        except ValueError:
            raise BadRequest(
                "header 'x-specgate-route' must be one of auto, spec, base", "x-specgate-route"
            ) from None
        if allow_override and override is not RouteOverride.AUTO:
            forced = Route(override.value)

    prompt_text = prompt_text[:MAX_PROMPT_TEXT]
    try:
        overlap, kind = predict_overlap(prompt_text, instruction[:MAX_PROMPT_TEXT])
    except Exception:  # prediction is an optimisation: never fail a request on it
        log.exception("overlap prediction failed")
        overlap, kind = 0.0, "unknown"

    features = RequestFeatures(
        model=model,
        stream=stream,
        temperature=temperature,
        top_p=top_p,
        n=n,
        max_tokens=max_tokens,
        prompt_chars=len(prompt_text),
        prompt_tokens=prompt_tokens if prompt_tokens is not None else (len(prompt_text) + 3) // 4,
        refused_params=tuple(refused),
        overlap=overlap,
        kind=kind,
        forced=forced,
        affinity=affinity_of(body, prompt_text),
    )
    return ParsedRequest(
        body=body,
        model=model,
        endpoint=endpoint,
        features=features,
        prompt_text=prompt_text,
        include_usage=include_usage,
    )
