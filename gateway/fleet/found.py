"""What a discovery source reports: the pair pods it found (shared by the sources and the
discovery that runs them)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One pair pod a source found: its address, its pod's name when known, and the ports
    the source read for the roles (None: the template's ``port``)."""

    address: str
    pod: str | None = None
    spec_port: int | None = None
    base_port: int | None = None


class Declare(Protocol):
    def __call__(self, endpoints: list[Endpoint]) -> None: ...


def stamp() -> float:
    return round(time.time(), 3)
