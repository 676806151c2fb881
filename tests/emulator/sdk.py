"""The OpenAI SDK as the emulator's tests use it: a client for an emulated engine's URL.

The SDK imports its resources and builds its response models lazily: importing this
module does that, at collection, not on the event loop of the first test.
"""

from __future__ import annotations

from typing import Any

import openai
from openai._models import construct_type
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent

with openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="none") as _warm:
    _ = (_warm.chat.completions, _warm.completions, _warm.responses)
    import openai.types.chat
    import openai.types.completion


def _warm_responses() -> None:
    """Run one streamed response's events (a reasoning item and a message) through the
    SDK's parsing and assembly, which build their models on first use."""
    usage = {
        "input_tokens": 1,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 2,
        "output_tokens_details": {"reasoning_tokens": 1},
        "total_tokens": 3,
    }
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": [], "content": [], "status": None}
    message = {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    text = {"type": "output_text", "text": "b", "annotations": [], "logprobs": []}
    thought = {"type": "reasoning_text", "text": "a"}

    def response(status: str, output: list[Any], use: Any) -> dict[str, Any]:
        return {
            "id": "resp_1",
            "created_at": 0,
            "model": "m",
            "object": "response",
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "status": status,
            "usage": use,
        }

    done = [{**reasoning, "content": [thought]}, {**message, "status": "completed", "content": [text]}]
    at = {"content_index": 0}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": response("in_progress", [], None)},
        {"type": "response.in_progress", "response": response("in_progress", [], None)},
        {"type": "response.output_item.added", "output_index": 0, "item": reasoning},
        {"type": "response.content_part.added", "item_id": "rs_1", "output_index": 0, **at, "part": thought},
        {"type": "response.reasoning_text.delta", "item_id": "rs_1", "output_index": 0, **at, "delta": "a"},
        {"type": "response.reasoning_text.done", "item_id": "rs_1", "output_index": 0, **at, "text": "a"},
        {"type": "response.content_part.done", "item_id": "rs_1", "output_index": 0, **at, "part": thought},
        {"type": "response.output_item.done", "output_index": 0, "item": done[0]},
        {"type": "response.output_item.added", "output_index": 1, "item": message},
        {"type": "response.content_part.added", "item_id": "msg_1", "output_index": 1, **at, "part": text},
        {
            "type": "response.output_text.delta",
            "item_id": "msg_1",
            "output_index": 1,
            **at,
            "delta": "b",
            "logprobs": [],
        },
        {
            "type": "response.output_text.done",
            "item_id": "msg_1",
            "output_index": 1,
            **at,
            "text": "b",
            "logprobs": [],
        },
        {"type": "response.content_part.done", "item_id": "msg_1", "output_index": 1, **at, "part": text},
        {"type": "response.output_item.done", "output_index": 1, "item": done[1]},
        {"type": "response.completed", "response": response("completed", done, usage)},
    ]
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=openai.omit, text_format=openai.omit)
    for n, e in enumerate(events):
        state.handle_event(construct_type(type_=ResponseStreamEvent, value={**e, "sequence_number": n}))
    construct_type(type_=Response, value=events[-1]["response"])


_warm_responses()


def sdk_client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)
