"""What one forwarded request produced, shared by the attempt logic and the relays."""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web

from gateway.proxy.sse import Harvest
from gateway.routing.types import Route


class Retryable(Exception):
    """An attempt failed before any byte reached the client."""

    def __init__(self, error: str, response: web.StreamResponse) -> None:
        super().__init__(error)
        self.error = error
        self.response = response  # what the client gets if no retry happens


@dataclass(slots=True)
class ProxyResult:
    response: web.StreamResponse
    engine: str | None = None
    route: Route | None = None
    reason: str | None = None
    status: int = 0
    ok: bool = False
    error: str | None = None
    retried: bool = False
    # The answer came (partly) from another engine than the decision's: moved at a regime
    # flip (``engine``/``route`` are then the engine it finished on).
    moved: bool = False
    harvest: Harvest = field(default_factory=Harvest)
    first_token_at: float | None = None  # the first token of any kind (reasoning, content, tool call)
    first_content_at: float | None = None  # the first content (or tool call) token
    last_token_at: float | None = None
