"""gRPC health checking (``grpc.health.v1.Health/Check``) for the Endpoint Picker.

Services, as the Endpoint Picker protocol names them: ``liveness`` (the process answers),
``readiness`` and ``envoy.service.ext_proc.v3.ExternalProcessor`` (it can pick: not
draining, and every model has an engine it knows the address of and holds healthy), and
"" (the server overall: as readiness). The two messages are one string and one enum, so
they are read and written with :mod:`.protowire`, like the ext_proc messages.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.envoy.h2stream import Stream
from gateway.envoy.protowire import LEN, ProtoError, fields

UNKNOWN, SERVING, NOT_SERVING = 0, 1, 2
GRPC_NOT_FOUND = 5
LIVENESS = "liveness"
READINESS = "readiness"
EXT_PROC = "envoy.service.ext_proc.v3.ExternalProcessor"
PATH = "/grpc.health.v1.Health/Check"


def service_name(message: bytes) -> str | None:
    """HealthCheckRequest.service (field 1, a string); None if the message is malformed."""
    name = ""
    try:
        for field, wire, value in fields(message):
            if field == 1 and wire == LEN:
                name = value.decode()
    except (ProtoError, UnicodeDecodeError):
        return None
    return name


def response(status: int) -> bytes:
    """HealthCheckResponse{status}."""
    return bytes((0x08, status)) if status else b""


class HealthCheck:
    """The handler of one Check call."""

    def __init__(self, stream: Stream, ready: Callable[[], bool]) -> None:
        self.stream = stream
        self.ready = ready
        self.answered = False

    def on_message(self, message: bytes) -> None:
        if self.answered:
            return
        self.answered = True
        name = service_name(message)
        if name is None:
            self.stream.finish(3, "malformed HealthCheckRequest")
            return
        if name == LIVENESS:
            status = SERVING
        elif name in ("", READINESS, EXT_PROC):
            status = SERVING if self.ready() else NOT_SERVING
        else:
            self.stream.finish(GRPC_NOT_FOUND, f"unknown service {name[:100]!r}")
            return
        self.stream.send(response(status))

    def on_end(self) -> None:
        if not self.answered:
            self.stream.finish(3, "no HealthCheckRequest")
            return
        self.stream.finish()

    def on_reset(self) -> None:
        return None

    @property
    def awaiting(self) -> bool:
        return not self.answered
