"""Continue an answer on the sibling engine: which requests may move, and the body that
asks the sibling for the rest.

At a regime flip the old engine's streams would otherwise run to their end beside the new
engine's, and on one GPU every request then waits for both engines' steps. A stream that
moves stops on the old engine (the gateway closes that response, which aborts it there)
and the new engine continues the answer from the text already sent:

- chat: the conversation plus the partial answer as the final assistant message, with
  ``continue_final_message: true`` and ``add_generation_prompt: false`` (vLLM's way to
  continue a message, rendered by the model's own chat template); a reasoning model's
  answer carries its reasoning in the think block (:func:`assistant_text`);
- completions: the prompt plus the text so far.

``max_tokens`` (and ``min_tokens``) shrink by the tokens already generated, reasoning
included (the engine's own count of the text: ``/tokenize``), and the usage reported to the
client adds them back and reports the original prompt's count, so the client sees one
answer within its limits.

Only requests whose continuation means what the client asked move: one streamed choice,
no seed on a sampled request (its answer must be reproducible), every field of
:data:`PINNED` at its default, a plain prompt (not token ids), and no stop string the text
so far ends in the middle of. Everything else drains where it started. (When a stream may
move, that is, in its content and not finished, is the relay's: :mod:`gateway.proxy.move`.)
"""

from __future__ import annotations

from typing import Any

from gateway.pipeline.request import CHAT, COMPLETIONS

MAX_MOVED_CHARS = 64 * 1024  # a longer partial answer is not moved (its prefill would cost more)
# A stream this close to its token limit finishes where it is: a move costs it a pause (the
# sibling's /tokenize and prefill, ~30 ms on vLLM) that a few tokens would pay dearly.
MIN_TOKENS_LEFT = 64

# Fields whose meaning does not survive a continuation, each with its default: a request
# carrying any of them with another value stays on its engine. After a move the text so far
# is prompt, not output: the penalties (which count the tokens generated so far: frequency
# and presence those of the output only, repetition those of prompt and output alike, with
# vLLM's own bookkeeping of which is which) would weigh it differently; log-probabilities,
# echo and token ids would describe tokens the new engine never produced; tools and
# structured output keep parser state that is not in the text; a prompt truncation would cut
# the answer so far; beam search keeps beams that the text does not carry; text with special
# tokens left in would be read back as prompt markup. ``min_p`` and ``logit_bias`` keep their
# meaning, but a speculative engine refuses them (such requests run on the plain engine,
# whose sibling would answer the move with a 400). ``n``/``best_of``
# and ``seed`` are checked in :func:`movable` (a seed pins only a sampled request: at
# temperature 0 decoding is greedy, the seed changes nothing, and the continuation is exact).
# ``max_tokens``/``max_completion_tokens``/``min_tokens`` keep their meaning: the
# continuation asks for what is left of them. A stop string the text ends inside of is
# checked at the move (:func:`splits_a_stop`).
PINNED: dict[str, object] = {
    "frequency_penalty": 0,
    "presence_penalty": 0,
    "repetition_penalty": 1,
    "logprobs": None,
    "top_logprobs": None,
    "prompt_logprobs": None,
    "echo": False,
    "suffix": None,
    "tools": None,
    "tool_choice": None,
    "functions": None,
    "function_call": None,
    "response_format": None,
    "structured_outputs": None,
    "guided_json": None,
    "guided_regex": None,
    "guided_choice": None,
    "guided_grammar": None,
    "bad_words": None,
    "continue_final_message": False,
    "return_tokens_as_token_ids": False,
    "return_token_ids": False,
    "truncate_prompt_tokens": None,
    "use_beam_search": False,
    "length_penalty": 1,
    "skip_special_tokens": True,
    "min_p": 0,
    "logit_bias": None,
}


def movable(body: dict[str, Any], endpoint: str) -> bool:
    """Whether a request could continue on the sibling engine if its regime flips."""
    if body.get("stream") is not True:
        return False
    if body.get("n", 1) not in (None, 1) or body.get("best_of", 1) not in (None, 1):
        return False
    if any(not _default(body.get(key), default) for key, default in PINNED.items()):
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


def _default(v: object, default: object) -> bool:
    """A field left at its default: absent, null, empty, or its default value (``logprobs: 0``
    is on: completions then return the sampled token's log-probability; ``false`` is off)."""
    if v is None or v == [] or v == {} or v is default:
        return True
    if isinstance(v, bool) or isinstance(default, bool):
        return v is False and default in (None, False)
    if isinstance(v, int | float) and isinstance(default, int | float):
        return v == default
    return False


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


def assistant_text(reasoning: str, content: str) -> str:
    """The partial answer as the final assistant message's content, per Qwen3's chat
    template: the reasoning in its think block, then the content. The template takes the
    reasoning from before ``</think>`` and renders ``<think>\\n{reasoning}\\n</think>\\n\\n{content}``
    (newlines at the block's edges stripped, as here), so the message renders as the text the
    model generated, and ``continue_final_message`` (which finds this content in the render)
    continues it. Without reasoning the content alone: the template renders its empty think
    block as it did in the original prompt."""
    if not reasoning:
        return content
    return "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n" + content.lstrip("\n")


def continuation_body(
    body: dict[str, Any], endpoint: str, text: str, tokens_so_far: int, served_model: str
) -> dict[str, Any] | None:
    """The request that asks the sibling engine for the rest of the answer, or None when
    there is nothing left to ask (the token budget is spent) or the text cannot move.
    ``text``: the answer so far (chat: :func:`assistant_text`); ``tokens_so_far``: every
    token generated for it, reasoning included (``max_tokens`` bounds them all)."""
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
    out.update(_continued_prompt(body, endpoint, text))
    return out


def _continued_prompt(body: dict[str, Any], endpoint: str, text: str) -> dict[str, Any]:
    """The prompt fields of the request continuing ``text``."""
    if endpoint == CHAT:
        return {
            "messages": [*body["messages"], {"role": "assistant", "content": text}],
            "add_generation_prompt": False,
            "continue_final_message": True,
        }
    prompt = body["prompt"]
    return {"prompt": (prompt if isinstance(prompt, str) else prompt[0]) + text}


# Fields of a chat request that shape how vLLM renders its prompt (and so its tokens).
_RENDERING = ("chat_template", "chat_template_kwargs", "add_special_tokens", "documents")


def prompt_tokenize_body(body: dict[str, Any], endpoint: str, served_model: str) -> dict[str, Any]:
    """vLLM's ``/tokenize`` request for the original prompt, rendered as the engine renders it
    for generation (chat template and generation prompt, special tokens): its count is the
    ``prompt_tokens`` the client's usage reports after a move. (The sibling's own count is of
    the continued prompt; less the answer's tokens it is not the original's: the template
    renders the continued message with tokens of its own, and the answer's first token can
    merge with the text before it.)"""
    out: dict[str, Any] = {"model": served_model}
    if endpoint == CHAT:
        out.update({k: body[k] for k in _RENDERING if k in body})
        out["messages"] = body["messages"]
        out["add_generation_prompt"] = True
    else:
        out["prompt"] = body["prompt"] if isinstance(body["prompt"], str) else body["prompt"][0]
    return out


def tokenize_body(text: str, served_model: str) -> dict[str, Any]:
    """vLLM's ``/tokenize`` request for the tokens of the partial answer (no special tokens
    added; the think markers in it are the tokenizer's own): what the old engine generated,
    which ``max_tokens`` bounds and the usage counts."""
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
