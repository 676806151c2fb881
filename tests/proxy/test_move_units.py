"""The pieces of a move, without sockets: what a stream has sent (its phase), the answer
read back from it, and the rewriting of the sibling's events."""

from __future__ import annotations

import json
from typing import Any

from gateway.pipeline.continuation import assistant_text
from gateway.proxy.move import CONTENT, FINISHED, OPENING, Continuation, MoveBoard, sent_answer
from gateway.proxy.sse import Harvest
from gateway.routing.types import Route
from specgate_lab.emulator.template import chat_template


def ev(delta: dict[str, Any] | None = None, finish: str | None = None, **top: Any) -> bytes:
    obj: dict[str, Any] = {"id": "chatcmpl-1", "created": 5, **top}
    if delta is not None:
        obj["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def test_a_stream_is_movable_only_in_its_content_phase() -> None:
    board = MoveBoard()
    t = board.enlist(Route.SPEC, "spec0")
    t.keep(ev({"role": "assistant", "content": ""}))
    assert t.phase == OPENING and not t.can_move
    t.keep(ev({"reasoning_content": "hmm"}) + ev({"reasoning": "..."}))
    assert t.phase == OPENING
    assert board.move(engine="spec0") == (0, 1)  # asked: moves once its content begins
    t.keep(ev({"content": "\n\nOnce"}))
    assert t.phase == CONTENT and t.can_move
    t.keep(ev({"content": "."}, "stop"))
    assert t.phase == FINISHED and not t.can_move
    done = board.enlist(Route.SPEC, "spec0")
    done.keep(ev({"content": "x"}, "length"))
    assert board.move(engine="spec0") == (0, 0)  # a finished stream is never asked
    assert not done.wanted


def test_the_answer_sent_so_far_is_read_back_in_its_parts() -> None:
    sent = [
        ev({"role": "assistant", "content": ""}),
        ev({"reasoning_content": "Let me"}),
        ev({"reasoning": " think."}),
        ev({"content": "Once"}),
    ]
    got = sent_answer(sent)
    assert got is not None
    assert (got.reasoning, got.content, got.id, got.created) == ("Let me think.", "Once", "chatcmpl-1", 5)
    assert sent_answer([*sent, ev({"content": "."}, "stop")]) is None  # finished
    assert sent_answer([*sent, b"data: [DONE]\n\n"]) is None


def test_the_siblings_events_become_the_rest_of_the_clients_answer() -> None:
    cont = Continuation("chatcmpl-1", 5, tokens_before=20, prompt_tokens=41)
    opening = {
        "id": "x",
        "created": 9,
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
    }
    assert not cont.apply(opening)
    # a parser that saw no </think> in its own output labels the continuation reasoning:
    # it is content (the move happened after the think block), and it is never dropped
    for key in ("reasoning_content", "reasoning"):
        obj = {"id": "x", "choices": [{"index": 0, "delta": {key: " upon", "content": None}}]}
        assert cont.apply(obj)
        assert obj["id"] == "chatcmpl-1" and obj["choices"][0]["delta"] == {"content": " upon"}
    finish = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    assert cont.apply(finish)
    usage = {"choices": [], "usage": {"prompt_tokens": 63, "completion_tokens": 30, "total_tokens": 93}}
    assert cont.apply(usage)
    assert usage["usage"] == {"prompt_tokens": 41, "completion_tokens": 50, "total_tokens": 91}


def test_a_sibling_whose_first_chunk_carries_reasoning_loses_nothing() -> None:
    """The opening chunk is the one with a role and nothing else: a first chunk with a role
    and a (reasoning-labelled) token keeps the token."""
    cont = Continuation(None, None, tokens_before=3)
    obj = {"choices": [{"index": 0, "delta": {"role": "assistant", "reasoning_content": " a"}}]}
    assert cont.apply(obj) and obj["choices"][0]["delta"] == {"content": " a"}


def test_learning_sees_reasoning_and_content_as_one_generated_sequence() -> None:
    h = Harvest()
    for delta in ({"role": "assistant", "content": ""}, {"reasoning_content": "R1"}, {"reasoning": "R2"}):
        h.take({"choices": [{"delta": delta}]})
    assert h.content_events == 2 and h.reasoning_events == 2
    h.take({"choices": [{"delta": {"content": "C"}}]})
    h.take({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 10}})
    assert h.completion_text == "<think>R1R2</think>C"
    assert h.reasoning_tokens == 8  # the completion tokens' share by characters (4 of 5)
    h.take({"choices": [], "usage": {"completion_tokens_details": {"reasoning_tokens": 6}}})
    assert h.reasoning_tokens == 6  # the engine's own count when it gives one


def test_an_answer_still_thinking_cannot_be_continued_through_the_template() -> None:
    """Why a stream moves only once its think block has ended: Qwen3's template renders a
    continued final message after a think block it closes itself, so a partial reasoning
    given back either way comes out closed, and the model would stop thinking."""
    user = [{"role": "user", "content": "Q"}]
    head = "<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
    as_content = [*user, {"role": "assistant", "content": "<think>\nLet me"}]
    as_field = [*user, {"role": "assistant", "content": "", "reasoning_content": "Let me"}]
    assert (
        chat_template(as_content, add_generation_prompt=False, continue_final_message=True)
        == head + "<think>\n\n</think>\n\n<think>\nLet me"
    )
    assert (
        chat_template(as_field, add_generation_prompt=False, continue_final_message=True)
        == head + "<think>\nLet me\n</think>\n\n"
    )
    # after the think block the answer so far renders exactly as it was generated
    done = [*user, {"role": "assistant", "content": assistant_text("\nLet me think.\n", "\n\nOnce")}]
    assert (
        chat_template(done, add_generation_prompt=False, continue_final_message=True)
        == head + "<think>\nLet me think.\n</think>\n\nOnce"
    )


def test_a_server_sending_both_reasoning_fields_says_it_once() -> None:
    """Between vLLM's rename of ``reasoning_content`` to ``reasoning`` and the old name's
    removal (and on other servers) a delta carries both, with the same text: the answer sent
    so far, the sibling's relabelled events and the learning read it once."""
    both = {"reasoning": "Let me think.", "reasoning_content": "Let me think."}
    got = sent_answer([ev(dict(both)), ev({"content": "Once"})])
    assert got is not None and (got.reasoning, got.content) == ("Let me think.", "Once")
    cont = Continuation(None, None, tokens_before=3)
    obj = {"choices": [{"index": 0, "delta": {**both, "content": None}}]}
    assert cont.apply(obj) and obj["choices"][0]["delta"] == {"content": "Let me think."}
    h = Harvest()
    h.take({"choices": [{"delta": dict(both)}]})
    h.take({"choices": [{"delta": {"content": "C"}}]})
    assert h.completion_text == "<think>Let me think.</think>C"
