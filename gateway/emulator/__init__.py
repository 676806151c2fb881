"""A GPU-free emulator of vLLM's OpenAI server with speculative decoding.

Layers (each usable alone):

- :mod:`gateway.emulator.engine`  - pure engine model: batching, prefill, speculative steps (types in
  :mod:`.engine_types`, drafting/verification in :mod:`.drafting`, step pricing in :mod:`.stepcost`)
- :mod:`gateway.emulator.device`  - GPU timeline shared by engines; clocks; real-time driver
- :mod:`gateway.emulator.textgen` - prompt-shaped answer text (what n-gram drafts match)
- :mod:`gateway.emulator.metrics` - vLLM's /metrics families per engine
- :mod:`gateway.emulator.server`  - the aiohttp OpenAI server; :mod:`.launch` starts groups (routes in
  :mod:`.openai_routes` and :mod:`.admin_routes`, JSON/SSE answers in :mod:`.responses`)
"""
