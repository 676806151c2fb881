"""What an emulated engine says it generated (its ``/metrics``): shared by the tests of the
emulator's and the gateway's Responses API (their pair: the ``thinking`` fixture)."""

from __future__ import annotations

import aiohttp


async def generated_tokens(url: str) -> float:
    """``vllm:generation_tokens_total`` of the engine at ``url``, summed over its labels."""
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        page = await r.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in page.splitlines()
        if line.startswith("vllm:generation_tokens_total{")
    )
