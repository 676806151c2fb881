"""The emulator's client errors, in vLLM's body ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    def __init__(
        self, message: str, *, status: int = 400, type_: str | None = None, param: str | None = None
    ):
        super().__init__(message)
        self.message = message
        self.status = status
        self.type = type_ or {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}.get(
            status, "BadRequestError"
        )
        self.param = param

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.status, self.param)


def error_body(message: str, type_: str, code: int, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
