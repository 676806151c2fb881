"""The OpenAI SDK as the emulator's tests use it: a client for an emulated engine's URL.

The SDK imports its resources and builds its response models lazily: importing this
module does that, at collection, not on the event loop of the first test.
"""

from __future__ import annotations

import openai

with openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="none") as _warm:
    _ = (_warm.chat.completions, _warm.completions)
    import openai.types.chat
    import openai.types.completion


def sdk_client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30)
