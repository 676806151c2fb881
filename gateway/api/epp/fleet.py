"""The Endpoint Picker's address book follows the pairs that join and leave (gateway.fleet).

The hook the EPP needs: after ``EppServer`` builds its ``EndpointBook``, call
``follow_fleet(self.book, state.fleet)`` once. An engine of a pair that joins is known by
its address at once (a discovered engine's ``endpoint`` is its pod's ``ip:port``); a pair
that leaves keeps its addresses while it drains (Envoy's answers for requests on it still
name it) and is forgotten when it is gone. A joined engine named by host name is resolved
by the book's next ``resolve()``.
"""

from __future__ import annotations

from gateway.api.epp.endpoints import EndpointBook
from gateway.fleet.registry import FleetRegistry, PairsChanged


def follow_fleet(book: EndpointBook, fleet: FleetRegistry | None) -> None:
    if fleet is None:
        return

    def changed(change: PairsChanged) -> None:
        for pair in change.added:
            for e in pair.engines:
                book.add(e)
        for pair in change.gone:
            for e in pair.engines:
                if book.engines.get(e.name) is e:
                    book.remove(e.name)

    fleet.listeners.append(changed)
