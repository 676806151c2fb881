"""The client-side SSE reader (gateway.wire.sse): events across chunks, and OpenAI streams."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.wire.sse import ChatStream, Event, EventDecoder, StreamError, json_payloads


def chunk(content: str | None = None, usage: int | None = None, **extra: object) -> bytes:
    obj: dict[str, object] = {"object": "chat.completion.chunk", "choices": [], **extra}
    if content is not None:
        obj["choices"] = [{"index": 0, "delta": {"content": content}}]
    if usage is not None:
        obj["usage"] = {"prompt_tokens": 5, "completion_tokens": usage}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


STREAM = (
    b": keep-alive\n\n"
    + chunk(None, role="assistant")  # the role chunk carries no content
    + chunk("Hel")
    + b": ping\n\n"
    + chunk("lo")
    + chunk(usage=7)
    + b"data: [DONE]\n\n"
)


def decode_all(pieces: list[bytes]) -> list[Event]:
    dec = EventDecoder()
    return [ev for p in pieces for ev in dec.feed(p)]


# -- the event decoder ------------------------------------------------------------------------


def test_events_split_at_every_byte_come_out_whole() -> None:
    whole = decode_all([STREAM])
    assert [e.data for e in whole][-1] == "[DONE]" and len(whole) == 5
    assert decode_all([STREAM[i : i + 1] for i in range(len(STREAM))]) == whole


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_chunking_gives_the_same_events(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(STREAM)]
    pieces = [STREAM[a:b] for a, b in itertools.pairwise(bounds)]
    assert decode_all(pieces) == decode_all([STREAM])


@pytest.mark.parametrize("eol", [b"\r\n", b"\r", b"\n"])
def test_crlf_cr_and_lf_line_ends(eol: bytes) -> None:
    text = b"data: a" + eol + b"data: b" + eol + eol + b"event: usage" + eol + b"data: c" + eol + eol
    assert decode_all([text]) == [Event("a\nb"), Event("c", "usage")]
    # the CR and the LF of a CRLF in different chunks are still one line end
    assert decode_all([text[:8], text[8:]]) == decode_all([text])
    assert decode_all([bytes([b]) for b in text]) == decode_all([text])
    assert decode_all([p for b in text for p in (bytes([b]), b"")]) == decode_all([text])


def test_comments_keepalives_and_other_fields_are_not_events() -> None:
    text = b":\n\n: keep-alive\n\nid: 7\nretry: 1000\n\nfoo: bar\n\ndata\n\ndata:x\n\n"
    # only the two data events; "data" without a colon is an empty data line
    assert decode_all([text]) == [Event(""), Event("x")]


def test_an_event_cut_off_by_the_end_of_the_stream_is_not_delivered() -> None:
    dec = EventDecoder()
    assert dec.feed(b'data: {"a": 1}\n') == []
    assert dec.feed(b'data: {"a"') == []


def test_utf8_split_between_chunks_and_a_leading_bom() -> None:
    text = "\ufeffdata: héllo wörld\n\n".encode()
    assert decode_all([text[i : i + 1] for i in range(len(text))]) == [Event("héllo wörld")]


def test_an_endless_line_is_refused() -> None:
    dec = EventDecoder()
    with pytest.raises(StreamError):
        for _ in range(2 + (1 << 20) // 65536):
            dec.feed(b"x" * 65536)


# -- OpenAI streams -----------------------------------------------------------------------------


def test_counts_content_chunks_usage_and_done() -> None:
    s = ChatStream()
    assert s.feed(STREAM) == 2
    s.finish()
    assert (s.content_chunks, s.completion_tokens, s.output_tokens, s.done) == (2, 7, 7, True)


def test_feed_reports_the_chunk_that_carries_the_first_token() -> None:
    s = ChatStream()
    first = STREAM.index(b"Hel")
    assert s.feed(STREAM[:first]) == 0
    assert s.feed(STREAM[first:]) == 2


def test_without_usage_the_content_chunks_are_the_tokens() -> None:
    s = ChatStream()
    s.feed(chunk("a") + chunk("b") + chunk("c") + b"data: [DONE]\n\n")
    assert s.output_tokens == 3 and s.completion_tokens is None


def test_completions_api_text_counts_as_content() -> None:
    s = ChatStream()
    body = json.dumps({"choices": [{"index": 0, "text": "x"}, {"index": 1, "text": ""}]})
    s.feed(f"data: {body}\n\ndata: [DONE]\n\n".encode())
    assert s.content_chunks == 1 and s.done


def test_events_after_done_are_ignored() -> None:
    s = ChatStream()
    s.feed(b"data: [DONE]\n\n" + chunk("late") + b"data: {not json\n\n")
    assert s.done and s.content_chunks == 0


def test_a_stream_without_done_fails_at_finish() -> None:
    s = ChatStream()
    s.feed(chunk("a"))
    with pytest.raises(StreamError, match=r"without data: \[DONE\]"):
        s.finish()


@pytest.mark.parametrize(
    ("event", "match"),
    [
        (b"data: {not json\n\n", "not JSON"),
        (b"data: [1, 2]\n\n", "JSON list"),
        (b'data: {"usage": {"completion_tokens": "many"}}\n\n', "not a number"),
    ],
)
def test_bad_json_is_a_stream_error(event: bytes, match: str) -> None:
    with pytest.raises(StreamError, match=match):
        ChatStream().feed(chunk("a") + event)


def test_an_error_event_raises_with_its_message_only() -> None:
    err = {"error": {"message": "engine failed", "type": "server_error", "code": 502}}
    s = ChatStream()
    with pytest.raises(StreamError, match="stream error: engine failed") as info:
        s.feed(chunk("secret completion text") + b"data: " + json.dumps(err).encode() + b"\n\n")
    assert "secret" not in str(info.value)
    assert s.content_chunks == 1


def test_a_bad_json_error_never_quotes_the_payload() -> None:
    with pytest.raises(StreamError) as info:
        ChatStream().feed(b'data: {"choices": [{"delta": {"content": "private words"\n\n')
    assert "private" not in str(info.value)


def test_json_payloads_skips_empty_data_and_done_and_refuses_bad_json() -> None:
    dec = EventDecoder()
    events = dec.feed(b'data: {"a": 1}\n\ndata:\n\ndata: [DONE]\n\n')
    assert json_payloads(events) == [{"a": 1}]
    with pytest.raises(ValueError):
        json_payloads(dec.feed(b"data: {not json\n\n"))


def test_reasoning_and_tool_call_deltas_are_output_too() -> None:
    """A thinking model streams reasoning before its answer, and a tool call streams its
    arguments: each delta is a token the engine produced, so each counts for TTFT and ITL."""
    s = ChatStream()
    events = [
        {"choices": [{"delta": {"reasoning": "Let me"}}]},
        {"choices": [{"delta": {"reasoning_content": " think"}}]},
        {"choices": [{"delta": {"content": "Hi"}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}}]},
        {"choices": [{"delta": {"role": "assistant"}}]},  # no output
    ]
    fed = [s.feed(f"data: {json.dumps(e)}\n\n".encode()) for e in events]
    assert fed == [1, 1, 1, 1, 0]
    assert (s.content_chunks, s.reasoning_chunks, s.tool_call_chunks) == (1, 2, 1)
    assert s.output_tokens == 4  # no usage chunk: the output deltas
