"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import json
from collections.abc import Mapping

from aiohttp import web

# HTTP status → OpenAI error type
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class ApiError(Exception):
    """Raised anywhere on the request path; turned into an OpenAI error response."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        type_: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.type = type_ or _TYPES.get(status, "invalid_request_error" if status < 500 else "internal_error")
        self.headers = dict(headers or {})

    def body(self) -> dict[str, object]:
        return error_body(self.message, self.type, self.code, self.param)


def error_body(message: str, type_: str, code: str | int | None, param: str | None) -> dict[str, object]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(err: ApiError, headers: Mapping[str, str] | None = None) -> web.Response:
    h = dict(headers or {})
    h.update(err.headers)
    return web.Response(
        status=err.status,
        body=json.dumps(err.body()).encode(),
        content_type="application/json",
        headers=h,
    )
