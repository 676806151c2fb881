"""A thinking engine (``reasoning_parser: qwen3``) speaks reasoning as vLLM does, and
continues an answer exactly from any point of its text: the OpenAI SDK against an emulated
pair, the answer begun on one engine and continued on the other."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from gateway.text import tokenize
from specgate_lab.emulator.device import Device
from specgate_lab.emulator.engine import Engine, EngineConfig
from specgate_lab.emulator.launch import EmulatorGroup, pair_launches, start_group
from specgate_lab.emulator.spec import parse_spec_config
from specgate_lab.emulator.template import chat_template
from tests.emulator.conftest import NGRAM5, run_sequential
from tests.emulator.prompts import CHATS, EDITS
from tests.emulator.sdk import sdk_client

pytestmark = pytest.mark.timeout(120)

SPEC, BASE = "qwen3-8b-spec", "qwen3-8b-base"
DOC = "Summarise the key points of this document, quoting it:\n" + " ".join(
    f"Le café naïve numéro {i} sert 日本語のテキスト et des crêpes; the Zürich office opened in {1990 + i}."
    for i in range(12)
)
USER = [{"role": "user", "content": DOC}]


async def _group(**kw: Any) -> EmulatorGroup:
    return await start_group(
        pair_launches(port_spec=0, port_base=0, reasoning_parser="qwen3", **kw), time_scale=0.02
    )


@pytest.fixture
async def thinking() -> AsyncIterator[EmulatorGroup]:
    group = await _group()
    try:
        yield group
    finally:
        await group.stop()


def _extra(obj: Any, key: str) -> Any:
    return (obj.model_extra or {}).get(key)


async def _chat(url: str, model: str, messages: list[Any], **kw: Any) -> Any:
    async with sdk_client(url) as client:
        return await client.chat.completions.create(
            model=model, messages=messages, temperature=0, **{"max_tokens": 2000, **kw}
        )


async def _complete(url: str, model: str, prompt: str, max_tokens: int = 2000) -> Any:
    async with sdk_client(url) as client:
        return await client.completions.create(
            model=model, prompt=prompt, temperature=0, max_tokens=max_tokens
        )


async def test_reasoning_streams_before_content_and_every_token_is_billed(thinking: EmulatorGroup) -> None:
    spec_url = thinking.urls[0]
    whole = await _chat(spec_url, SPEC, USER)
    msg = whole.choices[0].message
    reasoning, content = _extra(msg, "reasoning"), msg.content
    assert reasoning and content and "<think>" not in reasoning + content
    # the raw text a completion of the rendered prompt gets: the same answer, markers and all
    raw = (await _complete(spec_url, SPEC, chat_template(USER))).choices[0].text
    assert raw == f"<think>{reasoning}</think>{content}"
    # <think> \n reasoning \n </think> \n\n content: every one a generated token
    own = len(tokenize(reasoning.strip("\n"))) + len(tokenize(content.lstrip("\n")))
    assert whole.usage.completion_tokens == own + 5
    # /tokenize counts a thinking answer's text as the tokens generated, and a chat's
    # rendered messages as the prompt tokens billed
    async with aiohttp.ClientSession() as s:
        async with s.post(spec_url + "/tokenize", json={"prompt": raw}) as r:
            counted = await r.json()
        assert counted["count"] == whole.usage.completion_tokens
        async with s.post(spec_url + "/detokenize", json={"tokens": counted["tokens"]}) as r:
            assert (await r.json())["prompt"] == raw
        async with s.post(spec_url + "/detokenize", json={"tokens": ["x"]}) as r:
            assert r.status == 400
        async with s.post(spec_url + "/tokenize", json={"messages": USER}) as r:
            assert (await r.json())["count"] == whole.usage.prompt_tokens
    async with sdk_client(spec_url) as client:
        stream = await client.chat.completions.create(
            model=SPEC,
            messages=USER,
            temperature=0,
            max_tokens=2000,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    kinds = [
        "r" if _extra(d, "reasoning") else "c" for d in deltas[1:] if _extra(d, "reasoning") or d.content
    ]
    assert kinds == sorted(kinds, reverse=True) and "r" in kinds and "c" in kinds  # reasoning first
    assert "".join(_extra(d, "reasoning") or "" for d in deltas) == reasoning
    assert "".join(d.content or "" for d in deltas) == content
    assert (
        chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    )


async def test_logprobs_cover_every_generated_token(thinking: EmulatorGroup) -> None:
    r = await _chat(thinking.urls[0], SPEC, USER, logprobs=True, top_logprobs=2, max_tokens=40)
    entries = r.choices[0].logprobs.content
    assert len(entries) == 40 and entries[0].token == "<think>" and entries[0].logprob > -0.01
    assert all(len(e.top_logprobs) == 2 for e in entries)


async def test_max_tokens_bounds_reasoning_and_content(thinking: EmulatorGroup) -> None:
    r = await _chat(thinking.urls[1], BASE, USER, max_tokens=30)
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 30
    assert r.choices[0].message.content is None and _extra(r.choices[0].message, "reasoning")


async def test_enable_thinking_false_answers_content_only(thinking: EmulatorGroup) -> None:
    r = await _chat(
        thinking.urls[1], BASE, USER, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    msg = r.choices[0].message
    assert _extra(msg, "reasoning") is None and msg.content and "think>" not in msg.content


async def test_older_vllm_names_the_field_reasoning_content() -> None:
    group = await _group(reasoning_field="reasoning_content")
    try:
        r = await _chat(group.urls[0], SPEC, [{"role": "user", "content": CHATS[0]}])
    finally:
        await group.stop()
    msg = r.choices[0].message
    assert _extra(msg, "reasoning_content") and "reasoning" not in (msg.model_extra or {})


def _cuts(text: str, lo: int, rng: random.Random, n: int) -> list[int]:
    """Random cut points in ``text[lo:]``, plus cuts right after multibyte characters
    (mid-token where a token holds several)."""
    wide = [i + 1 for i in range(lo, len(text) - 1) if ord(text[i]) > 127]
    return sorted({*rng.sample(range(lo, len(text)), n), *rng.sample(wide, min(3, len(wide)))})


async def test_a_chat_continued_after_its_think_block_goes_on_with_the_same_answer(
    thinking: EmulatorGroup,
) -> None:
    """Continued on the other engine from anywhere in the content (the reasoning given back
    whole), the rest is the unmoved answer's rest, token for token."""
    spec_url, base_url = thinking.urls
    whole = await _chat(spec_url, SPEC, USER)
    reasoning, content = _extra(whole.choices[0].message, "reasoning"), whole.choices[0].message.content
    assert any(ord(c) > 127 for c in content), "the answer quotes the document's multibyte text"
    rng = random.Random(7)
    for cut in [0, 2, *_cuts(content, 2, rng, 5), len(content)]:
        given = {"role": "assistant", "reasoning": reasoning, "content": content[:cut]}
        rest = await _chat(
            base_url,
            BASE,
            [*USER, given],
            extra_body={"continue_final_message": True, "add_generation_prompt": False},
        )
        got = rest.choices[0].message
        assert _extra(got, "reasoning") is None, cut  # the prompt's think block has ended
        given_text = content[:cut] if cut >= 2 else ""  # the template strips the newlines before content
        assert (given_text + (got.content or "")) == (content.lstrip("\n") if cut < 2 else content), cut
        assert rest.choices[0].finish_reason == "stop"


async def test_a_completion_continued_anywhere_goes_on_with_the_same_answer(thinking: EmulatorGroup) -> None:
    """The rendered prompt plus any start of the answer (inside the think block, at its end,
    in the content, in the middle of a multibyte token) continues that answer; so does a
    raw completion prompt plus the start of its answer."""
    spec_url, base_url = thinking.urls
    rng = random.Random(3)
    for prompt in (chat_template(USER), DOC):
        whole = (await _complete(spec_url, SPEC, prompt)).choices[0].text
        end_think = whole.index("</think>")
        cuts = {end_think, end_think + len("</think>"), *_cuts(whole, len("<think>"), rng, 6)}
        for cut in sorted(cuts):
            rest = await _complete(base_url, BASE, prompt + whole[:cut])
            assert whole[:cut] + rest.choices[0].text == whole, (prompt[:20], cut)


async def test_an_answer_told_it_thought_nothing_goes_on_differently(thinking: EmulatorGroup) -> None:
    """Given back without its reasoning, the template renders an empty think block: the
    content that follows is conditioned on thinking nothing, not the unmoved answer's."""
    spec_url, base_url = thinking.urls
    messages = [{"role": "user", "content": EDITS[0]}]
    content = (await _chat(spec_url, SPEC, messages)).choices[0].message.content
    head = "".join(tokenize(content)[:20])
    rest = await _chat(
        base_url,
        BASE,
        [*messages, {"role": "assistant", "content": head}],
        extra_body={"continue_final_message": True, "add_generation_prompt": False},
    )
    assert head + rest.choices[0].message.content != content


async def test_an_older_parser_labels_a_continuation_after_the_think_block_reasoning() -> None:
    """vLLM's older parser reads its own output only: no ``</think>`` of its own, so the
    continued content comes back as reasoning (what a gateway moving streams must expect)."""
    group = await _group(reasoning_parser_mode="generated-only")
    try:
        spec_url, base_url = group.urls
        whole = (await _chat(spec_url, SPEC, USER)).choices[0].message
        reasoning, content = _extra(whole, "reasoning"), whole.content
        cut = len(content) // 2
        rest = await _chat(
            base_url,
            BASE,
            [*USER, {"role": "assistant", "reasoning": reasoning, "content": content[:cut]}],
            extra_body={"continue_final_message": True, "add_generation_prompt": False},
        )
    finally:
        await group.stop()
    got = rest.choices[0].message
    assert got.content is None and content[:cut] + _extra(got, "reasoning") == content


def _acceptance(prompts: list[str], reasoning: bool) -> float:
    """Mean acceptance length over the drafted steps of an engine's answers (ngram, k=5),
    in virtual time."""
    cfg = EngineConfig(
        "qwen3-8b-spec", spec=parse_spec_config(NGRAM5), reasoning_parser="qwen3" if reasoning else None
    )
    dev = Device()
    eng = dev.attach(Engine(cfg))
    reqs = [
        eng.make_request(chat_template([{"role": "user", "content": p}]), max_tokens=1500) for p in prompts
    ]
    run_sequential(dev, eng, reqs)
    if reasoning:
        assert all(r.output[0] == "<think>" and "</think>" in r.output for r in reqs)
    st = eng.stats
    return 1.0 + st.num_accepted / max(1, st.num_drafts)


def test_reasoning_answers_accept_drafts_by_the_prompts_nature() -> None:
    """The proposer drafts over reasoning and content alike: a thinking engine's acceptance
    still follows what the prompt asks (an edit's answer copies it, an open question's does
    not), and its reasoning, which quotes the prompt less, lowers an edit's acceptance."""
    edit, chat = _acceptance(EDITS, True), _acceptance(CHATS, True)
    assert edit > chat + 0.5
    assert _acceptance(EDITS, False) > edit


async def test_a_model_that_does_not_think_continues_after_the_empty_think_block(
    pair: EmulatorGroup,
) -> None:
    """Without a reasoning parser the model does not think, but a continued message still
    renders with Qwen3's empty think block: the rest is the unmoved answer's rest."""
    spec_url, base_url = pair.urls
    messages = [{"role": "user", "content": CHATS[0]}]  # an answer that starts with a space
    content = (await _chat(spec_url, SPEC, messages, max_tokens=200)).choices[0].message.content
    assert content.startswith(" ")
    for cut in _cuts(content, 1, random.Random(5), 6):
        rest = await _chat(
            base_url,
            BASE,
            [*messages, {"role": "assistant", "content": content[:cut]}],
            max_tokens=200,
            extra_body={"continue_final_message": True, "add_generation_prompt": False, "ignore_eos": True},
        )
        assert (content[:cut] + rest.choices[0].message.content).startswith(content), cut
