"""The emulator renders chat messages as Qwen3's chat template does."""

from __future__ import annotations

import pytest

from specgate_lab.emulator.errors import ApiError
from specgate_lab.emulator.template import chat_prompt, chat_template

USER = {"role": "user", "content": "Why is the sea salty?"}


def test_a_plain_conversation_opens_the_assistant_turn() -> None:
    msgs = [{"role": "system", "content": "Be brief."}, USER]
    assert chat_template(msgs) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhy is the sea salty?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("key", ["reasoning_content", "reasoning"])
def test_an_assistant_turn_after_the_last_query_carries_its_reasoning(key: str) -> None:
    msgs = [USER, {"role": "assistant", key: "\nRivers carry ions.\n", "content": "\n\nSalt, from rocks."}]
    assert chat_template(msgs, add_generation_prompt=False).endswith(
        "<|im_start|>assistant\n<think>\nRivers carry ions.\n</think>\n\nSalt, from rocks.<|im_end|>\n"
    )


def test_reasoning_is_split_out_of_the_content_at_the_end_of_think() -> None:
    msgs = [USER, {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nSalt."}]
    assert chat_template(msgs, add_generation_prompt=False).endswith(
        "<|im_start|>assistant\n<think>\nhmm\n</think>\n\nSalt.<|im_end|>\n"
    )


def test_a_continued_message_without_reasoning_gets_an_empty_think_block() -> None:
    body = {
        "messages": [USER, {"role": "assistant", "content": "Salt comes"}],
        "add_generation_prompt": False,
        "continue_final_message": True,
    }
    assert chat_prompt(body).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nSalt comes")


def test_earlier_assistant_turns_render_their_content_only() -> None:
    msgs = [
        USER,
        {"role": "assistant", "reasoning_content": "thinking", "content": "Salt."},
        {"role": "user", "content": "And rivers?"},
    ]
    text = chat_template(msgs)
    assert "thinking" not in text and "<think>" not in text
    assert "<|im_start|>assistant\nSalt.<|im_end|>\n<|im_start|>user\nAnd rivers?" in text


def test_enable_thinking_false_closes_an_empty_think_block() -> None:
    body = {"messages": [USER], "chat_template_kwargs": {"enable_thinking": False}}
    assert chat_prompt(body).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    with pytest.raises(ApiError):
        chat_prompt({"messages": [USER], "chat_template_kwargs": {"enable_thinking": "no"}})


def test_tool_results_go_in_a_user_turn() -> None:
    msgs = [USER, {"role": "tool", "content": "42"}, {"role": "tool", "content": "43"}]
    assert chat_template(msgs, add_generation_prompt=False).endswith(
        "<|im_start|>user\n<tool_response>\n42\n</tool_response>\n<tool_response>\n43\n</tool_response>"
        "<|im_end|>\n"
    )
