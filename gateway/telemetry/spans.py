"""The end of a request's span: its attributes (OpenTelemetry GenAI names where the
conventions name one: ``gen_ai.usage.*``), its status and its end time."""

from __future__ import annotations

from opentelemetry.trace import Span, Status, StatusCode


def end_span(
    span: Span, attrs: dict[str, int | float | None], error: str | None, duration_s: float | None
) -> str:
    """Set the attributes that have a value, the error (``error.type`` and an ERROR status)
    if any, end the span (``duration_s`` after its start when given: a duration measured
    elsewhere) and return its trace id (hex)."""
    for key, value in attrs.items():
        if value is not None:
            span.set_attribute(key, value)
    if error is not None:
        span.set_attribute("error.type", error)
        span.set_status(Status(StatusCode.ERROR, error))
    trace_id = f"{span.get_span_context().trace_id:032x}"
    start_ns = getattr(span, "start_time", None)
    if duration_s is not None and isinstance(start_ns, int):
        span.end(end_time=start_ns + int(duration_s * 1e9))
    else:
        span.end()
    return trace_id
