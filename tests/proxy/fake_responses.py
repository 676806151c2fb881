"""The Responses API (``POST /v1/responses``) as vLLM serves it, for :class:`FakeEngine`: one
message item of output text, whole or as the typed event stream the OpenAI SDK's
``responses.stream`` accumulates (created, item and part added, text deltas, done events,
completed with usage)."""

from __future__ import annotations

import json
import time
from typing import Any

PROMPT_TOKENS = 7
RESP_ID, MSG_ID = "resp_fake", "msg_fake"


def response_object(body: dict[str, Any], text: str | None, status: str, model: str) -> dict[str, Any]:
    """The response object; ``text`` None: still empty (``in_progress``)."""
    output = []
    if text is not None:
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        output.append(
            {"type": "message", "id": MSG_ID, "role": "assistant", "status": "completed", "content": [part]}
        )
    obj: dict[str, Any] = {
        "id": RESP_ID,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "output": output,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "parallel_tool_calls": True,
        "temperature": body.get("temperature", 1.0),
        "top_p": body.get("top_p", 1.0),
        "tool_choice": "auto",
        "tools": [],
        "store": body.get("store", True),
        "usage": None,
    }
    if text is not None:
        n = len(text.split()) or 1
        obj["usage"] = {
            "input_tokens": PROMPT_TOKENS,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": n,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": PROMPT_TOKENS + n,
        }
    return obj


def response_events(body: dict[str, Any], tokens: list[str], model: str) -> list[bytes]:
    """The stream, one SSE event per element, as ``event: <type>`` + ``data: <json>``."""
    text = "".join(tokens)
    where = {"item_id": MSG_ID, "output_index": 0, "content_index": 0}
    empty_part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
    item = {"type": "message", "id": MSG_ID, "role": "assistant", "status": "in_progress", "content": []}
    done = response_object(body, text, "completed", model)
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": response_object(body, None, "in_progress", model)},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.content_part.added", **where, "part": empty_part},
        *({"type": "response.output_text.delta", **where, "delta": t, "logprobs": []} for t in tokens),
        {"type": "response.output_text.done", **where, "text": text, "logprobs": []},
        {"type": "response.content_part.done", **where, "part": done["output"][0]["content"][0]},
        {"type": "response.output_item.done", "output_index": 0, "item": done["output"][0]},
        {"type": "response.completed", "response": done},
    ]
    return [
        f"event: {ev['type']}\ndata: {json.dumps({**ev, 'sequence_number': i})}\n\n".encode()
        for i, ev in enumerate(events)
    ]
