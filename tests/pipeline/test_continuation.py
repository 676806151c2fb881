"""Which requests may continue on the sibling engine, and the body that asks for the rest."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.pipeline.continuation import (
    MAX_MOVED_CHARS,
    MIN_TOKENS_LEFT,
    PINNED,
    assistant_text,
    continuation_body,
    movable,
    prompt_tokenize_body,
    splits_a_stop,
    tokenize_body,
    tokenize_count,
)
from gateway.pipeline.request import CHAT, COMPLETIONS

MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Rewrite this."}]


def chat(**kw: Any) -> dict[str, Any]:
    return {"model": "m", "messages": MSGS, "stream": True, "max_tokens": 100, **kw}


def test_a_plain_streamed_chat_or_completion_may_move() -> None:
    assert movable(chat(), CHAT)
    assert movable(chat(temperature=0.7, top_p=0.9, stop=["\n\n"], logprobs=False), CHAT)
    assert movable({"model": "m", "prompt": "def f(", "stream": True}, COMPLETIONS)
    assert movable({"model": "m", "prompt": ["def f("], "stream": True}, COMPLETIONS)
    # greedy decoding ignores a seed: the continuation is exact with it or without
    assert movable(chat(temperature=0, seed=7), CHAT)
    assert movable(chat(temperature=0.0, seed=7), CHAT)


@pytest.mark.parametrize(
    "change",
    [
        {"stream": False},
        {"n": 2},
        {"seed": 0},  # a sampled request (the engine's default temperature) with a seed
        {"seed": 7, "temperature": 0.7},
        {"seed": 7, "temperature": "0"},
        {"logprobs": True},
        {"top_logprobs": 3},
        {"tools": [{"type": "function", "function": {"name": "f"}}]},
        {"response_format": {"type": "json_object"}},
        {"structured_outputs": {"regex": "a+"}},
        {"continue_final_message": True, "add_generation_prompt": False},
        {"messages": [*MSGS, {"role": "assistant", "content": "Sure"}]},
    ],
)
def test_requests_whose_continuation_would_differ_stay(change: dict[str, Any]) -> None:
    assert not movable(chat(**change), CHAT)


def test_completions_with_token_ids_echo_or_several_prompts_stay() -> None:
    base = {"model": "m", "stream": True}
    assert not movable({**base, "prompt": [1, 2, 3]}, COMPLETIONS)
    assert not movable({**base, "prompt": ["a", "b"]}, COMPLETIONS)
    assert not movable({**base, "prompt": "a", "echo": True}, COMPLETIONS)
    assert not movable({**base, "prompt": "a", "logprobs": 0}, COMPLETIONS)  # 0 asks for one


def test_a_text_ending_inside_a_stop_string_does_not_move() -> None:
    body = chat(stop=["END", "\n\n"])
    assert splits_a_stop("hello EN", body) and splits_a_stop("line\n", body)
    assert not splits_a_stop("hello E N", body) and not splits_a_stop("done", chat())
    assert continuation_body(body, CHAT, "hello EN", 3, "m-base") is None


def test_the_chat_continuation_asks_for_the_rest_of_the_same_message() -> None:
    body = chat(max_completion_tokens=80, min_tokens=10, stream_options={"continuous_usage_stats": False})
    out = continuation_body(body, CHAT, "Here is", 4, "m-base")
    assert out is not None
    assert out["model"] == "m-base"
    assert out["messages"] == [*MSGS, {"role": "assistant", "content": "Here is"}]
    assert out["continue_final_message"] is True and out["add_generation_prompt"] is False
    assert out["max_tokens"] == 96 and out["max_completion_tokens"] == 76 and out["min_tokens"] == 6
    assert out["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
    assert body["messages"] == MSGS and body["max_tokens"] == 100  # the client's body untouched


def test_the_completion_continuation_extends_the_prompt() -> None:
    out = continuation_body(
        {"model": "m", "prompt": ["def f("], "stream": True}, COMPLETIONS, "a, b):", 4, "x"
    )
    assert out is not None and out["prompt"] == "def f(a, b):" and "max_tokens" not in out


def test_nothing_is_asked_when_the_budget_is_nearly_spent_or_the_text_too_long() -> None:
    assert continuation_body(chat(max_tokens=5), CHAT, "abcde", 5, "m") is None
    almost = chat(max_tokens=MIN_TOKENS_LEFT + 9)
    assert continuation_body(almost, CHAT, "x", 10, "m") is None  # 63 left: finishes where it is
    assert continuation_body(almost, CHAT, "x", 9, "m") is not None
    assert continuation_body(chat(), CHAT, "", 0, "m") is None
    assert continuation_body(chat(max_tokens=None), CHAT, "x" * (MAX_MOVED_CHARS + 1), 9, "m") is None


def test_tokenize_answers_are_read_defensively() -> None:
    assert tokenize_count({"count": 7, "tokens": [1]}) == 7
    assert tokenize_count({"tokens": [1, 2, 3]}) == 3
    assert tokenize_count({"count": -1}) is None and tokenize_count({"count": True}) is None
    assert tokenize_count(["x"]) is None


# A non-default value of every pinned field (one list: gateway.pipeline.continuation.PINNED).
PINNED_VALUES: dict[str, object] = {
    "frequency_penalty": 0.5,
    "presence_penalty": -0.5,
    "repetition_penalty": 1.1,
    "logprobs": True,
    "top_logprobs": 2,
    "prompt_logprobs": 1,
    "echo": True,
    "suffix": "end",
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "tool_choice": "auto",
    "functions": [{"name": "f"}],
    "function_call": "auto",
    "response_format": {"type": "json_object"},
    "structured_outputs": {"regex": "a+"},
    "guided_json": {"type": "object"},
    "guided_regex": "a+",
    "guided_choice": ["a", "b"],
    "guided_grammar": "root ::= 'a'",
    "bad_words": ["x"],
    "continue_final_message": True,
    "return_tokens_as_token_ids": True,
    "return_token_ids": True,
    "truncate_prompt_tokens": 100,
    "use_beam_search": True,
    "length_penalty": 0.8,
    "skip_special_tokens": False,
    "min_p": 0.05,
    "logit_bias": {"50256": -100},
}


def test_every_pinned_field_has_a_tested_value() -> None:
    assert set(PINNED_VALUES) == set(PINNED)


@pytest.mark.parametrize("key", sorted(PINNED))
def test_a_pinned_field_pins_only_when_not_at_its_default(key: str) -> None:
    assert not movable(chat(**{key: PINNED_VALUES[key]}), CHAT), key
    assert movable(chat(**{key: PINNED[key]}), CHAT), key
    assert movable(chat(**{key: None}), CHAT), key


def test_default_penalties_in_any_spelling_move() -> None:
    assert movable(chat(frequency_penalty=0.0, presence_penalty=0, repetition_penalty=1.0), CHAT)
    assert not movable(chat(frequency_penalty=True), CHAT)  # not a number: nothing to assume


def test_the_answer_so_far_is_written_as_qwen3_renders_it() -> None:
    assert assistant_text("", "Once upon") == "Once upon"
    assert assistant_text("\nLet me think.\n", "\n\nOnce") == "<think>\nLet me think.\n</think>\n\nOnce"
    out = continuation_body(chat(max_tokens=400), CHAT, assistant_text("R", "C"), 330, "m")
    assert out is not None and out["max_tokens"] == 70  # every generated token counts
    assert out["messages"][-1] == {"role": "assistant", "content": "<think>\nR\n</think>\n\nC"}


def test_the_original_prompt_is_tokenized_as_the_engine_renders_it() -> None:
    body = chat(chat_template_kwargs={"enable_thinking": False}, temperature=0)
    tb = prompt_tokenize_body(body, CHAT, "m-base")
    assert tb == {
        "model": "m-base",
        "messages": MSGS,
        "add_generation_prompt": True,
        "chat_template_kwargs": {"enable_thinking": False},
    }
    assert prompt_tokenize_body({"prompt": ["def f("]}, COMPLETIONS, "x") == {
        "model": "x",
        "prompt": "def f(",
    }
    assert tokenize_body("abc", "x") == {"model": "x", "prompt": "abc", "add_special_tokens": False}
