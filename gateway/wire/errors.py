"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

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
        self.type = type_ or openai_type(status)
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


def openai_type(status: int) -> str:
    """OpenAI's error ``type`` for an HTTP status."""
    return _TYPES.get(status, "invalid_request_error" if status < 500 else "internal_error")


ENGINE_ERROR_CODE = "engine_error"


def engine_error(obj: Mapping[str, Any], status: int | None) -> dict[str, object] | None:
    """An engine's error object in the gateway's one shape, or None when ``obj`` is no error.

    vLLM answers ``{"error": {"message", "type": "BadRequestError", "param", "code": 400}}``
    (older releases put those fields at the top level with ``"object": "error"``). The
    gateway keeps the engine's ``message`` and ``param`` and speaks OpenAI's vocabulary for
    the rest, as for its own errors: ``type`` from the status (``invalid_request_error``
    for a 400), and ``code`` as the gateway's own errors carry it: a string in a response
    body (``engine_error``, or the engine's own code when that is a string), the status
    number inside a stream (``status`` None: an event has no HTTP status, the engine's
    numeric ``code`` stands for it).
    """
    err = obj.get("error")
    if not isinstance(err, Mapping):
        if obj.get("object") != "error" or "message" not in obj:
            return None
        err = obj
    raw_code = err.get("code")
    numeric = raw_code if isinstance(raw_code, int) and not isinstance(raw_code, bool) else None
    message = err.get("message")
    param = err.get("param")
    if status is None:
        number = numeric if numeric is not None and 400 <= numeric <= 599 else 500
        code: str | int = number
        type_ = openai_type(number)
    else:
        code = raw_code if isinstance(raw_code, str) and raw_code else ENGINE_ERROR_CODE
        type_ = openai_type(status)
    return error_body(
        message if isinstance(message, str) else "the engine refused the request",
        type_,
        code,
        param if isinstance(param, str) else None,
    )
