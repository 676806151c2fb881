"""The OpenAI-compatible HTTP surface of the gateway (aiohttp)."""
