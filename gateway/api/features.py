"""Decode a request body once (strict JSON) and hand it to the shared request pipeline.

Validation and feature extraction live in :mod:`gateway.pipeline.request` (the simulator
calls the same function); here its :class:`~gateway.pipeline.request.BadRequest` becomes
an OpenAI 400 error.
"""

from __future__ import annotations

import json
import math
from typing import Any

from gateway.pipeline import request as pipeline
from gateway.pipeline.request import CHAT, COMPLETIONS, MAX_PROMPT_TEXT, RESPONSES, BadRequest, ParsedRequest
from gateway.wire.errors import ApiError

__all__ = [
    "CHAT",
    "COMPLETIONS",
    "MAX_PROMPT_TEXT",
    "RESPONSES",
    "ParsedRequest",
    "model_name",
    "parse_json",
    "parse_request",
]


MAX_JSON_DEPTH = 64  # deeper request bodies are refused (OpenAI bodies, tool schemas included, are shallow)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    f = float(text)
    if not math.isfinite(f):
        raise ValueError(f"number {text[:40]} is out of range")
    return f


_DECODER = json.JSONDecoder(parse_constant=_reject_constant, parse_float=_finite_float)


def _check_tree(body: Any) -> None:
    """Refuse bodies nested deeper than MAX_JSON_DEPTH or holding unpaired UTF-16 surrogates
    (``"\\ud800"`` parses, but cannot be encoded again to forward it)."""
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        obj, depth = stack.pop()
        if isinstance(obj, str):
            items: Any = ()
            strings: Any = (obj,)
        elif isinstance(obj, dict):
            items, strings = obj.values(), obj.keys()
        elif isinstance(obj, list):
            items, strings = obj, ()
        else:
            continue
        for s in strings:
            if not s.isascii():
                try:
                    s.encode("utf-8")
                except UnicodeEncodeError:
                    raise ApiError(
                        400, "request body holds an unpaired UTF-16 surrogate escape", code="invalid_json"
                    ) from None
        if items:
            if depth >= MAX_JSON_DEPTH:
                raise ApiError(
                    400, f"request body is nested deeper than {MAX_JSON_DEPTH} levels", code="invalid_json"
                )
            stack.extend((v, depth + 1) for v in items)


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        # json.loads(raw, ...) with these hooks, without building a decoder per request.
        body = _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except UnicodeDecodeError:
        raise ApiError(400, "request body is not valid UTF-8", code="invalid_json") from None
    except RecursionError:
        raise ApiError(400, "request body is nested too deeply", code="invalid_json") from None
    except ValueError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object", code="invalid_json")
    if _may_fail_tree_check(raw):
        _check_tree(body)
    return body


def _may_fail_tree_check(raw: bytes) -> bool:
    """False when :func:`_check_tree` provably passes, judged from the raw bytes alone (fast,
    C-level scans): fewer brackets than MAX_JSON_DEPTH cannot nest that deep, and ASCII text
    without a ``\\ud``/``\\uD`` escape cannot hold a lone surrogate."""
    if raw.count(b"{") + raw.count(b"[") >= MAX_JSON_DEPTH:
        return True
    return not raw.isascii() or b"\\ud" in raw or b"\\uD" in raw


def _api_error(exc: BadRequest) -> ApiError:
    return ApiError(400, exc.message, param=exc.param, code="invalid_value")


def model_name(body: dict[str, Any]) -> str:
    try:
        return pipeline.model_name(body)
    except BadRequest as exc:
        raise _api_error(exc) from None


def parse_request(
    body: dict[str, Any],
    endpoint: str,
    route_header: str | None,
    *,
    allow_override: bool,
) -> ParsedRequest:
    """Validate a parsed body and extract features; raises :class:`ApiError` (400) on bad input."""
    try:
        return pipeline.parse_request(body, endpoint, route_header, allow_override=allow_override)
    except BadRequest as exc:
        raise _api_error(exc) from None
