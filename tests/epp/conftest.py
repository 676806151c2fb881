"""Fixtures of the Endpoint Picker tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from specgate_lab.emulator.launch import EmulatorGroup, pair_launches, start_group


@pytest.fixture
async def same_name_pair() -> AsyncIterator[EmulatorGroup]:
    """An emulated pair whose engines both serve the client's model name (``qwen3-8b``), as
    an Envoy deployment runs them: a request then fits either engine as it is, so the
    sibling can be the fallback endpoint."""
    group = await start_group(
        pair_launches(
            port_spec=0, port_base=0, name_spec="qwen3-8b", name_base="qwen3-8b", per_request_metrics=True
        ),
        time_scale=0.05,
    )
    try:
        yield group
    finally:
        await group.stop()
