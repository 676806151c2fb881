"""Reading OpenAI streaming responses on the client side: server-sent events in, counts out.

Two small pieces, for every client in the project that reads a stream (the Locust kit,
``specgate bench``'s load generator, the demo):

* :class:`EventDecoder` turns bytes, in whatever chunks the socket delivers them, into
  complete events as the SSE format defines them: lines end with LF, CRLF or CR (also
  when a CRLF is split between two chunks), ``:`` lines are comments (keep-alives),
  ``data:`` lines of one event are joined with LF, a blank line ends the event, and an
  event cut off by the end of the stream is never delivered.
* :class:`ChatStream` reads the events of an OpenAI streaming completion: it counts the
  chunks that carry content (``choices[].delta.content``, or ``choices[].text`` of the
  completions API), keeps the usage chunk's ``completion_tokens``, stops at
  ``data: [DONE]`` and raises :class:`StreamError` for an error event, a data event that
  is not a JSON object, or (from :meth:`ChatStream.finish`) a stream without ``[DONE]``.

Neither keeps any content: errors name what was wrong, never the text that was streamed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

DONE = "[DONE]"
MAX_LINE_BYTES = 1 << 20  # a longer unterminated line is not an event stream


@dataclass(frozen=True, slots=True)
class Event:
    """One dispatched event: its data lines joined with LF, and its ``event:`` type."""

    data: str
    event: str = "message"


class StreamError(ValueError):
    """The stream broke the format, carried an error event, or ended without ``[DONE]``."""


class EventDecoder:
    """Incremental SSE decoder: :meth:`feed` chunks, get the events they complete."""

    __slots__ = ("_buf", "_data", "_event", "_skip_lf", "_started")

    def __init__(self) -> None:
        self._buf = b""  # the start of a line whose end has not arrived yet
        self._data: list[str] = []
        self._event = ""
        self._started = False  # past the first bytes (where a BOM may sit)
        self._skip_lf = False  # the last chunk ended with a CR

    def feed(self, chunk: bytes) -> list[Event]:
        if not chunk:
            return []
        buf = self._buf + chunk if self._buf else chunk
        if not self._started:
            if len(buf) < 3 and b"\xef\xbb\xbf".startswith(buf):
                self._buf = buf  # could still be a BOM
                return []
            self._started = True
            if buf.startswith(b"\xef\xbb\xbf"):
                buf = buf[3:]
        # A CR ends a line at once; if it was the first half of a CRLF split between two
        # chunks, the LF that starts the next chunk is not a second line end.
        if self._skip_lf and buf.startswith(b"\n"):
            buf = buf[1:]
        self._skip_lf = buf.endswith(b"\r")
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        rest = lines.pop()  # the unterminated tail ("" when buf ended with a line end)
        if len(rest) > MAX_LINE_BYTES:
            raise StreamError(f"a line longer than {MAX_LINE_BYTES} bytes")
        self._buf = rest
        events: list[Event] = []
        for raw in lines:
            if not raw:  # blank line: dispatch
                if self._data:
                    events.append(Event("\n".join(self._data), self._event or "message"))
                self._data = []
                self._event = ""
                continue
            line = raw.decode("utf-8", errors="replace")
            name, sep, value = line.partition(":")
            if not name and sep:
                continue  # a comment: keep-alives and the like
            if value.startswith(" "):
                value = value[1:]
            if name == "data":
                self._data.append(value)
            elif name == "event":
                self._event = value
            # id, retry and unknown fields change nothing a client here needs
        return events


def json_payloads(events: list[Event]) -> list[Any]:
    """The JSON of each event's data, skipping empty data and ``[DONE]`` (what a load tool
    reading an OpenAI stream wants); raises ``ValueError`` on data that is not JSON."""
    out = []
    for ev in events:
        data = ev.data.strip()
        if data and data != DONE:
            out.append(json.loads(data))
    return out


@dataclass(slots=True)
class ChatStream:
    """What a client counts in an OpenAI streaming response (chat or completions).

    ``feed`` bytes as they arrive; it returns how many output chunks they completed (content,
    reasoning or tool-call deltas: each is a token the engine produced), so the caller can take
    the time of the first one (TTFT) and the gaps between them (inter-token latency). Stop
    reading once ``done``.
    """

    content_chunks: int = 0
    reasoning_chunks: int = 0  # deltas of ``reasoning`` (or the older ``reasoning_content``)
    tool_call_chunks: int = 0  # deltas of ``tool_calls``
    completion_tokens: int | None = None  # from the usage chunk, when the server sent one
    done: bool = False  # ``data: [DONE]`` seen; later events are ignored
    decoder: EventDecoder = field(default_factory=EventDecoder, init=False, repr=False, compare=False)

    @property
    def output_chunks(self) -> int:
        """Deltas that carried output of any kind."""
        return self.content_chunks + self.reasoning_chunks + self.tool_call_chunks

    @property
    def output_tokens(self) -> int:
        """The usage chunk's ``completion_tokens``, else the number of output chunks."""
        return self.completion_tokens if self.completion_tokens is not None else self.output_chunks

    def feed(self, chunk: bytes) -> int:
        before = self.output_chunks
        for ev in self.decoder.feed(chunk):
            if self.done:
                break
            self.take(ev)
        return self.output_chunks - before

    def take(self, ev: Event) -> None:
        """Account one event. Raises :class:`StreamError` for an error event or bad JSON."""
        if ev.data.strip() == DONE:
            self.done = True
            return
        try:
            obj = json.loads(ev.data)
        except ValueError:
            raise StreamError("a data event that is not JSON") from None
        if not isinstance(obj, dict):
            raise StreamError(f"a data event that is a JSON {type(obj).__name__}, not an object")
        if "error" in obj:
            err = obj["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            raise StreamError(f"stream error: {str(msg)[:200]}")
        choices = obj.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            if isinstance(delta, dict):
                if delta.get("content"):
                    self.content_chunks += 1
                elif delta.get("reasoning") or delta.get("reasoning_content"):
                    self.reasoning_chunks += 1
                elif delta.get("tool_calls"):
                    self.tool_call_chunks += 1
            elif choice.get("text"):
                self.content_chunks += 1
        usage = obj.get("usage")
        if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
            try:
                self.completion_tokens = int(usage["completion_tokens"])
            except (TypeError, ValueError):
                raise StreamError("a usage chunk whose completion_tokens is not a number") from None

    def finish(self) -> None:
        """Call at the end of the stream: raises :class:`StreamError` unless ``[DONE]`` came."""
        if not self.done:
            raise StreamError("stream ended without data: [DONE]")
