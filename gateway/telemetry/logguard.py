"""One guard on every log line the process writes: no request bytes, no floods.

Installed on the process's log handlers at start (``specgate serve``), so it sees the
records of every logger (``gateway``, ``specgate``, ``aiohttp.*``, ``asyncio``, OTel):

- **Exception text is never written.** A record's exception becomes its type names and,
  for the gateway's own loggers, the traceback's frames (file, line, function, source
  line: code, not data). ``str(exc)`` can hold request bytes (aiohttp's parser errors
  quote the raw header line, pydantic errors the input value), so it is dropped.
- **Other libraries' messages are reduced to their template.** The first line only, at
  most 200 characters, arguments replaced by a placeholder unless they are numbers or IP
  addresses, quoted literals (``'...'``, ``b"..."``: reprs of bytes and strings) removed.
  ``aiohttp.access`` lines (the raw request line, query string included) are dropped: the
  gateway writes its own access line (``specgate.access``, metadata only).
- **Warnings and errors (and records naming a ``throttle_key``) are rate-limited** per
  logger, level and template (the gateway's own records also by their short scalar
  arguments, e.g. the engine name): at most one line per key per ``interval_s``; the
  rest are counted and reported as ``N similar messages suppressed`` by
  :meth:`LogGuard.flush`, which ``specgate serve`` calls every second and at exit.
  ``specgate.access`` lines are never rate-limited.

A record may carry ``extra={"throttle_key": "..."}`` to name its key explicitly.
"""

from __future__ import annotations

import ipaddress
import logging
import re
import traceback
from collections.abc import Callable, Iterable
from types import TracebackType

from gateway.telemetry.logs import ACCESS_LOGGER
from gateway.telemetry.logthrottle import LogThrottle

OWN_LOGGERS = ("gateway", "specgate")
DROPPED_LOGGERS = frozenset({"aiohttp.access"})
SUMMARY_LOGGER = "specgate.log"
_UNTHROTTLED = frozenset({ACCESS_LOGGER, SUMMARY_LOGGER})
MAX_FOREIGN_MSG = 200
_QUOTED = re.compile(r"""[bBrRuU]?'[^'\n]*(?:'|$)|[bBrRuU]?"[^"\n]*(?:"|$)""")
_MAX_CHAIN = 5

ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]


def _own(name: str) -> bool:
    return name in OWN_LOGGERS or name.startswith(tuple(n + "." for n in OWN_LOGGERS))


def _safe_arg(v: object) -> object:
    if v is None or isinstance(v, bool | int | float):
        return v
    if isinstance(v, BaseException):
        return f"<{type(v).__name__}>"
    if isinstance(v, str) and len(v) <= 45:
        try:
            ipaddress.ip_address(v)
            return v
        except ValueError:
            pass
    return f"<{type(v).__name__}>"


def _template_line(msg: object) -> str:
    """The first line of a record's template, quoted literals removed (no data)."""
    text = msg if isinstance(msg, str) else f"<{type(msg).__name__}>"
    return _QUOTED.sub("'…'", text.split("\n", 1)[0])[:MAX_FOREIGN_MSG]


def _foreign_message(record: logging.LogRecord) -> str:
    template = record.msg if isinstance(record.msg, str) else f"<{type(record.msg).__name__}>"
    args = record.args
    try:
        if isinstance(args, tuple) and args:
            text = template % tuple(_safe_arg(a) for a in args)
        elif isinstance(args, dict) and args:
            text = template % {k: _safe_arg(v) for k, v in args.items()}
        else:
            text = template
    except (TypeError, ValueError, KeyError):
        text = template
    first = text.split("\n", 1)[0]
    return _QUOTED.sub("'…'", first)[:MAX_FOREIGN_MSG]


def _chain(exc: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen and len(seen) < _MAX_CHAIN:
        seen.add(id(e))
        yield e
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)


def _type_name(e: BaseException) -> str:
    t = type(e)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def safe_exception(exc: BaseException, *, frames: bool) -> str:
    """``exc`` and its causes as type names (and, with ``frames``, their tracebacks'
    frames), innermost last, without any exception's text."""
    parts: list[str] = []
    for e in reversed(list(_chain(exc))):
        if frames and e.__traceback__ is not None:
            parts.append("Traceback (most recent call last; exception text withheld):\n")
            parts.extend(traceback.format_list(traceback.extract_tb(e.__traceback__)))
        parts.append(_type_name(e) + "\n")
    return "".join(parts).rstrip("\n")


def _throttle_key(record: logging.LogRecord, own: bool) -> str:
    explicit = getattr(record, "throttle_key", None)
    if isinstance(explicit, str):
        return f"{record.name}|{explicit}"
    key = f"{record.name}|{record.levelno}|{record.msg if isinstance(record.msg, str) else '?'}"
    args = record.args
    if (
        own
        and isinstance(args, tuple)
        and args
        and all(isinstance(a, int | float) or (isinstance(a, str) and len(a) <= 64) for a in args)
    ):
        key += "|" + "|".join(map(str, args))
    return key


class LogGuard(logging.Filter):
    """A handler filter: sanitises every record, rate-limits warnings and errors."""

    def __init__(self, interval_s: float = 5.0, *, clock: Callable[[], float] | None = None) -> None:
        super().__init__()
        self.throttle = LogThrottle(interval_s, clock=clock) if clock else LogThrottle(interval_s)
        self.summaries = logging.getLogger(SUMMARY_LOGGER)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name in DROPPED_LOGGERS:
            return False
        if getattr(record, "_specgate_guarded", False):  # a second handler: already done
            return True
        own = _own(record.name)
        throttled = record.name not in _UNTHROTTLED and (
            record.levelno >= logging.WARNING or hasattr(record, "throttle_key")
        )
        if throttled:  # keyed and labelled by the template, before it is reduced
            key = _throttle_key(record, own)
            label = f"{record.name}: {_template_line(record.msg)}"
        if not own:
            record.msg, record.args = _foreign_message(record), None
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = safe_exception(record.exc_info[1], frames=own)
            record.exc_info = None
        elif record.exc_text and not own:
            record.exc_text = None
        if throttled:
            ok, held, span = self.throttle.admit(key, label)
            if not ok:
                return False
            if held:
                record.msg = f"{record.getMessage()} ({held} similar suppressed in the last {span:.0f}s)"
                record.args = None
        record._specgate_guarded = True
        return True

    def flush(self, *, final: bool = False) -> int:
        """Write one summary line per key whose interval is over (``final``: per key) with
        suppressed lines not reported yet."""
        done = self.throttle.flush(final=final)
        for s in done:
            self.summaries.warning("%s", s.message())
        return len(done)


def install(handlers: Iterable[logging.Handler], interval_s: float = 5.0) -> LogGuard:
    """Put one :class:`LogGuard` on each of ``handlers`` (and the ``logging`` lastResort)."""
    guard = LogGuard(interval_s)
    for h in handlers:
        h.addFilter(guard)
    if logging.lastResort is not None:
        logging.lastResort.addFilter(guard)
    return guard
