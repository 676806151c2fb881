"""A GPU-free emulator of vLLM's OpenAI server with speculative decoding.

Layers (each usable alone):

- :mod:`specgate_lab.emulator.engine`  - pure engine model: batching, prefill, speculative steps (types in
  :mod:`.engine_types`, drafting/verification in :mod:`.drafting`, step pricing in :mod:`.stepcost`)
- :mod:`specgate_lab.emulator.device`  - GPU timeline shared by engines; clocks; real-time driver
- :mod:`specgate_lab.emulator.textgen` - prompt-shaped answer text (what n-gram drafts match)
- :mod:`specgate_lab.emulator.metrics` - vLLM's /metrics families per engine
- :mod:`specgate_lab.emulator.server`  - the aiohttp OpenAI server; :mod:`.launch` starts groups (routes in
  :mod:`.openai_routes` and :mod:`.admin_routes`, JSON/SSE answers in :mod:`.responses`)
"""
