"""Continue an answer on the sibling engine: which requests may move, and the body that
asks the sibling for the rest.

At a regime flip the old engine's streams would otherwise run to their end beside the new
engine's, and on one GPU every request then waits for both engines' steps. A stream that
moves stops on the old engine (the gateway closes that response, which aborts it there)
and the new engine continues the answer from the text already sent:

- chat: the conversation plus the partial answer as the final assistant message, with
  ``continue_final_message: true`` and ``add_generation_prompt: false`` (vLLM's way to
  continue a message, rendered by the model's own chat template);
- completions: the prompt plus the text so far.

``max_tokens`` (and ``min_tokens``) shrink by the tokens already generated (the engine's
own count of the text: ``/tokenize``), and the usage reported to the client adds them
back, so the client sees one answer within its limits.

Only requests whose continuation means what the client asked move: one streamed choice,
no seed (its answer must be reproducible), no log-probabilities or echo (they describe
tokens the new engine never produced), no tools or structured output (their parser state
is not in the text), a plain prompt (not token ids), and no stop string the text so far
ends in the middle of. Everything else drains where it started.
"""

from __future__ import annotations

from typing import Any

from gateway.pipeline.request import CHAT, COMPLETIONS

MAX_MOVED_CHARS = 64 * 1024  # a longer partial answer is not moved (its prefill would cost more)
# A stream this close to its token limit finishes where it is: a move costs it a pause (the
# sibling's /tokenize and prefill, ~30 ms on vLLM) that a few tokens would pay dearly.
MIN_TOKENS_LEFT = 64

# Fields whose meaning does not survive a continuation: a request carrying any of them
# (with a value other than "off") stays on its engine. ``seed`` pins only a sampled
# request (its answer is one reproducible draw): at temperature 0 decoding is greedy, the
# seed changes nothing, and the continuation is exact.
_PINNED = (
    "logprobs",
    "top_logprobs",
    "prompt_logprobs",
    "echo",
    "suffix",
    "tools",
    "tool_choice",
    "functions",
    "function_call",
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "bad_words",
    "continue_final_message",
    "return_tokens_as_token_ids",
)


def movable(body: dict[str, Any], endpoint: str) -> bool:
    """Whether a request could continue on the sibling engine if its regime flips."""
    if body.get("stream") is not True:
        return False
    if body.get("n", 1) not in (None, 1) or body.get("best_of", 1) not in (None, 1):
        return False
    if any(not _off(body.get(key)) for key in _PINNED):
        return False
    if body.get("seed") is not None and not _greedy(body.get("temperature")):
        return False
    if body.get("add_generation_prompt", True) is not True:
        return False
    if endpoint == CHAT:
        messages = body.get("messages")
        return isinstance(messages, list) and bool(messages) and _last_role(messages) != "assistant"
    if endpoint == COMPLETIONS:
        prompt = body.get("prompt")
        return isinstance(prompt, str) or (
            isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str)
        )
    return False


def _greedy(temperature: object) -> bool:
    """Temperature 0 as sent (absent: the engine's default, which samples)."""
    return isinstance(temperature, int | float) and not isinstance(temperature, bool) and temperature == 0


def _off(v: object) -> bool:
    """A field left at its default: absent, null, false or empty (``logprobs: 0`` is on:
    completions then return the sampled token's log-probability)."""
    return v is None or v is False or v == [] or v == {}


def _last_role(messages: list[Any]) -> object:
    last = messages[-1]
    return last.get("role") if isinstance(last, dict) else None


def _stops(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list):
        return tuple(s for s in stop if isinstance(s, str))
    return ()


def splits_a_stop(text: str, body: dict[str, Any]) -> bool:
    """The text ends with a proper prefix of a stop string: the engine that continues it
    checks stop strings in its own output only, and would miss that one."""
    for stop in _stops(body):
        for i in range(1, len(stop)):
            if text.endswith(stop[:i]):
                return True
    return False


def continuation_body(
    body: dict[str, Any], endpoint: str, text: str, tokens_so_far: int, served_model: str
) -> dict[str, Any] | None:
    """The request that asks the sibling engine for the rest of the answer, or None when
    there is nothing left to ask (the token budget is spent) or the text cannot move."""
    if not text or len(text) > MAX_MOVED_CHARS or splits_a_stop(text, body):
        return None
    out = dict(body)
    out["model"] = served_model
    for key in ("max_tokens", "max_completion_tokens"):
        n = body.get(key)
        if isinstance(n, int) and not isinstance(n, bool):
            if n - tokens_so_far < MIN_TOKENS_LEFT:
                return None
            out[key] = n - tokens_so_far
    mt = body.get("min_tokens")
    if isinstance(mt, int) and not isinstance(mt, bool) and mt > 0:
        out["min_tokens"] = max(0, mt - tokens_so_far)
    opts = body.get("stream_options")
    out["stream_options"] = {**(opts if isinstance(opts, dict) else {}), "include_usage": True}
    if endpoint == CHAT:
        out["messages"] = [*body["messages"], {"role": "assistant", "content": text}]
        out["add_generation_prompt"] = False
        out["continue_final_message"] = True
    else:
        prompt = body["prompt"]
        out["prompt"] = (prompt if isinstance(prompt, str) else prompt[0]) + text
    return out


def tokenize_body(text: str, served_model: str) -> dict[str, Any]:
    """vLLM's ``/tokenize`` request for the tokens of the partial answer (no special tokens)."""
    return {"model": served_model, "prompt": text, "add_special_tokens": False}


def tokenize_count(obj: object) -> int | None:
    """The ``count`` of vLLM's ``/tokenize`` answer; None when the answer is not one."""
    if not isinstance(obj, dict):
        return None
    n = obj.get("count")
    if isinstance(n, int) and not isinstance(n, bool) and n >= 0:
        return n
    tokens = obj.get("tokens")
    return len(tokens) if isinstance(tokens, list) else None
