"""What the Endpoint Picker reads of a reasoning model's streamed answer: its first token of
any kind (TTFT), its first content, and the whole generated text for learning."""

from __future__ import annotations

import json
from typing import Any

from gateway.api.epp.observe import Observed
from gateway.routing.types import Route


def ev(delta: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "delta": delta}]}).encode() + b"\n\n"


def test_the_first_reasoning_token_is_the_first_token_and_content_is_timed_apart() -> None:
    obs = Observed(engine="spec0", route=Route.SPEC, stream=True)
    obs.feed(ev({"role": "assistant", "content": ""}), False, now=1.0)
    assert obs.first_token_at is None
    obs.feed(ev({"reasoning_content": "\nHmm"}) + ev({"reasoning": ".\n"}), False, now=2.0)
    assert obs.first_token_at == 2.0 and obs.first_content_at is None
    obs.feed(ev({"content": "\n\nYes"}), False, now=5.0)
    obs.feed(ev({"tool_calls": [{"index": 0, "id": "c"}]}) + b"data: [DONE]\n\n", True, now=6.0)
    assert (obs.first_token_at, obs.first_content_at, obs.last_token_at) == (2.0, 5.0, 6.0)
    assert obs.harvest.completion_text == "<think>\nHmm.\n</think>\n\nYes"
    assert obs.harvest.reasoning_events == 2 and obs.harvest.content_events == 4
