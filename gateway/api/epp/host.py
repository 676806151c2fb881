"""What a stream of the Endpoint Picker needs of its server: the gateway state, the
endpoint book, the access-log endings, and the observation budgets.

:class:`~gateway.api.epp.server.EppServer` implements it; the streams
(:mod:`.extproc`, :mod:`.finish`) are typed against this Protocol, so they do not import
the server that imports them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from gateway.api.epp.endings import Endings
from gateway.api.epp.endpoints import EndpointBook

if TYPE_CHECKING:
    from gateway.api.state import GatewayState


class PickerServer(Protocol):
    state: GatewayState
    book: EndpointBook
    endings: Endings

    def watch(self) -> bool:
        """Whether to ask for this request's response headers."""
        ...

    def sample(self, model: str) -> bool:
        """Whether to read this answer's body."""
        ...
