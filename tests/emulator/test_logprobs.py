"""The emulator's ``logprobs`` and ``echo``: vLLM's shapes and checks, values from the text."""

from __future__ import annotations

import statistics

import aiohttp
import openai
import pytest

from gateway.text import tokenize
from specgate_lab.emulator.launch import EmulatorGroup
from specgate_lab.emulator.textgen import AnswerGenerator, prompt_logprobs
from tests.emulator.prompts import CHATS, EDITS
from tests.emulator.sdk import sdk_client

pytestmark = pytest.mark.timeout(60)


async def test_chat_logprobs_follow_the_answer_and_copies_read_confident(pair: EmulatorGroup) -> None:
    async with sdk_client(pair.urls[1]) as client:

        async def answer(prompt: str) -> openai.types.chat.ChatCompletion:
            return await client.chat.completions.create(
                model="qwen3-8b-base",
                messages=[{"role": "user", "content": prompt}],
                temperature=0,
                max_tokens=60,
                logprobs=True,
                top_logprobs=3,
            )

        edit, chat = await answer(EDITS[0]), await answer(CHATS[0])
        plain = await client.chat.completions.create(
            model="qwen3-8b-base", messages=[{"role": "user", "content": CHATS[0]}], max_tokens=5
        )
    assert plain.choices[0].logprobs is None  # not asked: none
    means = []
    for r in (edit, chat):
        lp = r.choices[0].logprobs
        assert lp is not None and lp.content
        assert "".join(e.token for e in lp.content) == r.choices[0].message.content
        assert len(lp.content) == r.usage.completion_tokens  # type: ignore[union-attr]
        for e in lp.content:
            assert e.logprob <= 0.0 and e.bytes == list(e.token.encode())
            assert len(e.top_logprobs) == 3
            assert (e.top_logprobs[0].token, e.top_logprobs[0].logprob) == (e.token, e.logprob)
            others = [t.logprob for t in e.top_logprobs[1:]]
            assert others == sorted(others, reverse=True)
        means.append(statistics.mean(e.logprob for e in lp.content))
    # an edit copies its source: its tokens are far likelier than an open chat's new words
    assert means[0] > means[1] + 2.0


async def test_chat_stream_carries_each_chunks_logprobs(pair: EmulatorGroup) -> None:
    async with sdk_client(pair.urls[0]) as client:
        stream = await client.chat.completions.create(
            model="qwen3-8b-spec",
            messages=[{"role": "user", "content": EDITS[1]}],
            temperature=0,
            max_tokens=40,
            logprobs=True,
            stream=True,
        )
        chunks = [c async for c in stream]
    assert chunks[0].choices[0].logprobs is None  # the role's chunk
    content, tokens = "", ""
    for c in chunks[1:]:
        choice = c.choices[0]
        content += choice.delta.content or ""
        assert choice.logprobs is not None and choice.logprobs.content is not None
        tokens += "".join(e.token for e in choice.logprobs.content)
        assert all(e.top_logprobs == [] for e in choice.logprobs.content)
    assert content and tokens == content


async def test_completions_echo_and_logprobs_unary_and_stream(pair: EmulatorGroup) -> None:
    prompt = "the cat sat on the mat, the cat sat on"
    async with sdk_client(pair.urls[1]) as client:
        r = await client.completions.create(
            model="qwen3-8b-base", prompt=prompt, echo=True, logprobs=2, max_tokens=12, temperature=0
        )
        stream = await client.completions.create(
            model="qwen3-8b-base",
            prompt=prompt,
            echo=True,
            logprobs=2,
            max_tokens=12,
            temperature=0,
            stream=True,
        )
        chunks = [c async for c in stream]
    text = r.choices[0].text
    lp = r.choices[0].logprobs
    assert text.startswith(prompt) and len(text) > len(prompt)
    assert lp is not None and lp.tokens and lp.text_offset and lp.token_logprobs and lp.top_logprobs
    assert "".join(lp.tokens) == text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(len(lp.tokens))]
    n_prompt = len(tokenize(prompt))
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(v is not None for v in lp.token_logprobs[1:])
    answer = zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True)
    for tok, value, top in list(answer)[n_prompt:]:
        assert top is not None and next(iter(top)) == tok and top[tok] == value and len(top) <= 3
    # the prompt's second "the cat sat on" continues pairs seen before: likelier than their first
    assert lp.token_logprobs[9] > lp.token_logprobs[1]  # type: ignore[operator]
    # streamed: the prompt in the first chunk, offsets running on across chunks
    assert chunks[0].choices[0].text.startswith(prompt)
    streamed = "".join(c.choices[0].text for c in chunks)
    offsets = [o for c in chunks for o in c.choices[0].logprobs.text_offset]  # type: ignore[union-attr]
    toks = [t for c in chunks for t in c.choices[0].logprobs.tokens]  # type: ignore[union-attr]
    assert streamed == text and "".join(toks) == text and offsets == lp.text_offset


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("chat", {"top_logprobs": 2}, "when using `top_logprobs`, `logprobs` must be set to true."),
        ("chat", {"logprobs": True, "top_logprobs": -2}, "`top_logprobs` must be a positive value or -1."),
        ("chat", {"logprobs": True, "top_logprobs": 21}, "greater than max allowed: 20"),
        ("chat", {"logprobs": True, "top_logprobs": -1}, "Requested sample logprobs of 151936"),
        ("chat", {"logprobs": True, "top_logprobs": "3"}, "`top_logprobs` must be an integer."),
        ("completions", {"logprobs": -1}, "`logprobs` must be a positive value."),
        ("completions", {"logprobs": 25}, "greater than max allowed: 20"),
        ("completions", {"prompt_logprobs": 1, "stream": True}, "not available when `stream=True`"),
    ],
)
async def test_logprobs_fields_checked_as_vllm_checks_them(
    pair: EmulatorGroup, path: str, body: dict[str, object], message: str
) -> None:
    base: dict[str, object] = (
        {"messages": [{"role": "user", "content": "hi"}]} if path == "chat" else {"prompt": "hi"}
    )
    url = pair.urls[1] + ("/v1/chat/completions" if path == "chat" else "/v1/completions")
    async with aiohttp.ClientSession() as s, s.post(url, json={**base, **body, "max_tokens": 2}) as r:
        assert r.status == 400
        assert message in (await r.json())["error"]["message"]


def test_generator_logprobs_rank_alternatives_and_name_the_replaced_source_token() -> None:
    prompt = EDITS[0]
    gen = AnswerGenerator(prompt, tokenize(prompt), temperature=1.5, seed=7)
    n = 400
    gen.token(n)
    replaced = [i for i in range(n) if i in gen._alt]  # sampled in place of a source token
    assert replaced, "at T=1.5 some copied tokens are sampled over"
    for i in range(n):
        top = gen.top(i, 4)
        assert top[0] == (gen.token(i), gen.logprob(i)) and len(top) == 4
        assert [v for _, v in top[1:]] == sorted((v for _, v in top[1:]), reverse=True)
    i = replaced[0]
    assert gen.top(i, 2)[1][0] == gen._alt[i]  # the source token is the likeliest other
    assert gen.top(i, 2)[1][1] > gen.logprob(i)


def test_prompt_logprobs_favour_repeated_pairs() -> None:
    toks = tokenize("so alpha beta gamma alpha beta")
    values = prompt_logprobs(toks)
    assert values[0] is None and len(values) == len(toks)
    first, again = values[toks.index(" beta")], values[len(toks) - 1]
    assert first is not None and again is not None and again > first
