"""OpenAI request validation and vLLM-shaped response bodies for the emulator.

Only the fields the emulator acts on are interpreted; every field it reads is
type-checked, and errors come back in vLLM's body
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from specgate_lab.emulator.errors import ApiError
from specgate_lab.emulator.template import chat_prompt, model_tokenize

MAX_LOGPROBS = 20  # vLLM's --max-logprobs default
VOCAB_SIZE = 151_936  # Qwen3's: the ids /tokenize answers with
SPEC_UNSUPPORTED_MESSAGE = "min_p and logit_bias parameters won't work with speculative decoding."


@dataclass(slots=True)
class ParsedRequest:
    chat: bool
    prompts: list[str]  # one per prompt (completions may batch several)
    prompt_tokens: list[list[str]]
    max_tokens: int | None
    temperature: float
    n: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    stop: tuple[str, ...]
    seed: int | None
    ignore_eos: bool
    min_p: float
    logit_bias: dict[str, float] = field(default_factory=dict)
    echo: bool = False
    #: logprobs asked for: how many alternatives per token (chat's ``top_logprobs``,
    #: completions' ``logprobs``); None: none asked
    logprobs: int | None = None

    @property
    def spec_unsupported(self) -> bool:
        return self.min_p > 0.0 or bool(self.logit_bias)


def _num(body: dict[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    v = body.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not lo <= v <= hi:
        raise ApiError(f"{key} must be a number in [{lo}, {hi}], got {v!r}", param=key)
    return float(v)


def _int(body: dict[str, Any], key: str, lo: int, hi: int) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ApiError(f"{key} must be an integer in [{lo}, {hi}], got {v!r}", param=key)
    return v


def _bool(body: dict[str, Any], key: str, default: bool = False) -> bool:
    v = body.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise ApiError(f"{key} must be a boolean", param=key)
    return v


def _prompts(body: dict[str, Any]) -> list[str]:
    p = body.get("prompt")
    if isinstance(p, str):
        return [p]
    if isinstance(p, list) and p:
        if all(isinstance(x, str) for x in p):
            return list(p)
        if all(isinstance(x, int) and not isinstance(x, bool) for x in p):
            return ["".join(f" t{x}" for x in p)]
        if all(isinstance(x, list) and all(isinstance(y, int) for y in x) for x in p):
            return ["".join(f" t{y}" for y in x) for x in p]
    raise ApiError("prompt must be a string, a list of strings or a list of token ids", param="prompt")


def check_body(body: Any, served_model_name: str) -> dict[str, Any]:
    """A request body as vLLM first checks it: a JSON object naming this engine's model
    (or none)."""
    if not isinstance(body, dict):
        raise ApiError("request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != served_model_name:
        raise ApiError(f"The model `{model}` does not exist.", status=404, param="model")
    return body


def parse_request(body: Any, *, chat: bool, served_model_name: str, max_model_len: int) -> ParsedRequest:
    body = check_body(body, served_model_name)
    prompts = [chat_prompt(body)] if chat else _prompts(body)
    toks = [model_tokenize(p) for p in prompts]
    if not all(toks):  # as vLLM: an empty prompt is a client error (it would schedule nothing)
        raise ApiError("The decoder prompt cannot be empty", param="prompt")
    max_tokens = _int(body, "max_completion_tokens" if chat else "max_tokens", 1, 1 << 30)
    if chat and max_tokens is None:
        max_tokens = _int(body, "max_tokens", 1, 1 << 30)
    longest = max(len(t) for t in toks)
    if longest >= max_model_len or (max_tokens is not None and longest + max_tokens > max_model_len):
        raise ApiError(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{longest + (max_tokens or 0)} tokens ({longest} in the messages, {max_tokens or 0} in the "
            "completion). Please reduce the length of the messages or completion.",
            param="max_tokens" if max_tokens else "messages" if chat else "prompt",
        )
    _num(body, "top_p", 1.0, 1e-9, 1.0)
    _num(body, "presence_penalty", 0.0, -2.0, 2.0)
    _num(body, "frequency_penalty", 0.0, -2.0, 2.0)
    _num(body, "repetition_penalty", 1.0, 1e-9, 100.0)
    _int(body, "top_k", -1, 1 << 20)
    stream = _bool(body, "stream")
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise ApiError("stream_options must be an object", param="stream_options")
    so = so or {}
    if so and not stream:
        raise ApiError("Stream options can only be defined when `stream=True`.", param="stream_options")
    stop_raw = body.get("stop")
    if stop_raw is None:
        stop: tuple[str, ...] = ()
    elif isinstance(stop_raw, str):
        stop = (stop_raw,)
    elif isinstance(stop_raw, list) and all(isinstance(s, str) for s in stop_raw):
        stop = tuple(stop_raw)
    else:
        raise ApiError("stop must be a string or a list of strings", param="stop")
    lb = body.get("logit_bias")
    if lb is not None and (
        not isinstance(lb, dict)
        or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in lb.values())
    ):
        raise ApiError("logit_bias must map token ids to numbers", param="logit_bias")
    logprobs = _logprobs(body, chat=chat, stream=stream)
    return ParsedRequest(
        chat=chat,
        prompts=prompts,
        prompt_tokens=toks,
        max_tokens=max_tokens,
        temperature=_num(body, "temperature", 1.0, 0.0, 2.0),
        n=_int(body, "n", 1, 128) or 1,
        stream=stream,
        include_usage=_bool(so, "include_usage"),
        continuous_usage=_bool(so, "continuous_usage_stats"),
        stop=stop,
        seed=_int(body, "seed", -(1 << 63), (1 << 64) - 1),
        ignore_eos=_bool(body, "ignore_eos"),
        min_p=_num(body, "min_p", 0.0, 0.0, 1.0),
        logit_bias={str(k): float(v) for k, v in (lb or {}).items()},
        echo=_bool(body, "echo"),
        logprobs=logprobs,
    )


def _count(body: dict[str, Any], key: str) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if not isinstance(v, int):  # as vLLM's check: a JSON bool is an int there too
        raise ApiError(f"`{key}` must be an integer.", param=key)
    return int(v)


def _logprobs(body: dict[str, Any], *, chat: bool, stream: bool) -> int | None:
    """vLLM's checks of the logprobs fields, in its words; the count of alternatives per
    token, capped as an engine started with the default ``--max-logprobs`` (20) caps it."""
    prompt = _count(body, "prompt_logprobs")
    if prompt is not None:
        if stream and (prompt > 0 or prompt == -1):
            raise ApiError("`prompt_logprobs` are not available when `stream=True`.", param="prompt_logprobs")
        if prompt < -1:
            raise ApiError("`prompt_logprobs` must be a positive value or -1.", param="prompt_logprobs")
    if chat:
        top = _count(body, "top_logprobs")
        if top is not None and top < -1:
            raise ApiError("`top_logprobs` must be a positive value or -1.", param="top_logprobs")
        on = _bool(body, "logprobs")
        if top is not None and (top == -1 or top > 0) and not on:
            raise ApiError("when using `top_logprobs`, `logprobs` must be set to true.", param="top_logprobs")
        n = (top or 0) if on else None
    else:
        n = _count(body, "logprobs")
        if n is not None and n < 0:
            raise ApiError("`logprobs` must be a positive value.", param="logprobs")
    for asked in (n, prompt):
        if asked is not None:
            wanted = VOCAB_SIZE if asked == -1 else asked
            if wanted > MAX_LOGPROBS:
                raise ApiError(
                    f"Requested sample logprobs of {wanted}, which is greater than max allowed: "
                    f"{MAX_LOGPROBS}"
                )
    return n


# --- bodies ------------------------------------------------------------------------------


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def chunk(
    *,
    chat: bool,
    rid: str,
    created: int,
    model: str,
    index: int,
    text: str,
    finish_reason: str | None,
    role: bool = False,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    choice: dict[str, Any]
    if chat:
        delta: dict[str, Any] = {"role": "assistant", "content": text} if role else {"content": text}
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    else:
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}
    if finish_reason is not None:
        choice["stop_reason"] = None
    return {
        "id": rid,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
    }


def full_response(
    *,
    chat: bool,
    rid: str,
    created: int,
    model: str,
    choices: list[tuple[str, str]],
    prompt_tokens: int,
    completion_tokens: int,
    logprobs: list[dict[str, Any]] | None = None,
    reasoning: list[str] | None = None,
    reasoning_field: str = "reasoning_content",
) -> dict[str, Any]:
    """``reasoning``: what a reasoning parser took out of each chat choice's text, shown
    in ``reasoning_field`` (and an empty part as null, as vLLM shows it)."""
    out: list[dict[str, Any]] = []
    for i, (text, reason) in enumerate(choices):
        lp = None if logprobs is None else logprobs[i]
        if chat:
            message: dict[str, Any] = {
                "role": "assistant",
                "content": text,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "tool_calls": [],
                "reasoning_content": None,
            }
            if reasoning is not None:
                del message["reasoning_content"]
                message[reasoning_field] = reasoning[i] or None
                message["content"] = text or None
            out.append(
                {"index": i, "message": message, "logprobs": lp, "finish_reason": reason, "stop_reason": None}
            )
        else:
            out.append(
                {
                    "index": i,
                    "text": text,
                    "logprobs": lp,
                    "finish_reason": reason,
                    "stop_reason": None,
                    "prompt_logprobs": None,
                }
            )
    return {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": out,
        "usage": usage(prompt_tokens, completion_tokens),
        "prompt_logprobs": None,
        "kv_transfer_params": None,
    }


def models_body(served: str, root: str, max_model_len: int, created: int | None = None) -> dict[str, Any]:
    created = created or int(time.time())
    return {
        "object": "list",
        "data": [
            {
                "id": served,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": root,
                "parent": None,
                "max_model_len": max_model_len,
                "permission": [
                    {
                        "id": "modelperm-" + uuid.uuid4().hex,
                        "object": "model_permission",
                        "created": created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
        ],
    }
