"""The real OpenAI Python SDK, sync and async, streaming and not, against the gateway."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import openai
import pytest

from tests.proxy.fake_engine import FakeEngine
from tests.proxy.harness import harness

MSGS = [{"role": "user", "content": "say hello"}]
KEY = "client-key-0001"


def _client(key: str = "unused") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key=key, max_retries=0)


@pytest.fixture
def make_client() -> Callable[[str], openai.AsyncOpenAI]:
    """Build SDK clients off the event loop (the constructor loads TLS certificates and the
    SDK imports its resources lazily); tests point them at the gateway afterwards."""
    warm = _client()
    _ = warm.chat.completions, warm.completions, warm.models
    return lambda key="unused": _client(key)


async def test_async_sdk_chat_non_stream_and_stream(make_client: Callable[..., openai.AsyncOpenAI]) -> None:
    client = make_client()
    async with harness() as h:
        client.base_url = h.openai_base  # type: ignore[assignment]
        try:
            resp = await client.chat.completions.create(model="m1", messages=MSGS, temperature=0)  # type: ignore[arg-type]
            assert resp.model == "m1"
            assert resp.choices[0].message.content == "Hello, world!"
            assert resp.usage is not None and resp.usage.completion_tokens == 4

            stream = await client.chat.completions.create(
                model="m1",
                messages=MSGS,  # type: ignore[arg-type]
                stream=True,
                stream_options={"include_usage": True},
            )
            parts: list[str] = []
            usage = None
            async for chunk in stream:
                assert chunk.model == "m1"
                if chunk.choices and chunk.choices[0].delta.content:
                    parts.append(chunk.choices[0].delta.content)
                if chunk.usage:
                    usage = chunk.usage
            assert "".join(parts) == "Hello, world!"
            assert usage is not None and usage.completion_tokens == 4
        finally:
            await client.close()
    assert h.spec.requests[0].body["model"] == "m1-spec"  # temperature 0 → speculative
    assert h.base.requests[0].body["model"] == "m1-base"  # default temperature 1 → plain


async def test_async_sdk_with_raw_response_headers(make_client: Callable[..., openai.AsyncOpenAI]) -> None:
    client = make_client()
    async with harness() as h:
        client.base_url = h.openai_base  # type: ignore[assignment]
        try:
            raw = await client.chat.completions.with_raw_response.create(
                model="m1",
                messages=MSGS,  # type: ignore[arg-type]
                extra_headers={"x-specgate-route": "spec"},
            )
            assert raw.headers["x-specgate-route"] == "spec"
            assert raw.headers["x-specgate-reason"] == "forced"
            assert raw.headers["x-request-id"]
        finally:
            await client.close()


def _sync_calls(base_url: str) -> tuple[str, str, list[str], str]:
    with openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0) as client:
        chat = client.chat.completions.create(model="m1", messages=MSGS)  # type: ignore[arg-type]
        comp = client.completions.create(model="m1", prompt="once upon a time", max_tokens=8)
        stream = client.completions.create(model="m1", prompt="once", stream=True)
        texts = [c.choices[0].text for c in stream if c.choices]
        models = client.models.list()
        return chat.choices[0].message.content or "", comp.choices[0].text, texts, models.data[0].id


async def test_sync_sdk_in_a_thread_with_api_key() -> None:
    async with harness(server={"api_keys": [KEY]}) as h:
        chat, comp, texts, model_id = await asyncio.to_thread(_sync_calls, h.openai_base)
    assert chat == "Hello, world!"
    assert comp == "Hello, world!"
    assert "".join(texts) == "Hello, world!"
    assert model_id == "m1"
    # the client's key is not forwarded to the engines
    assert all("Authorization" not in r.headers for r in h.base.requests)


async def test_sdk_raises_typed_errors(make_client: Callable[..., openai.AsyncOpenAI]) -> None:
    bad, good = make_client("wrong-key-0000"), make_client(KEY)
    async with harness(server={"api_keys": [KEY]}) as h:
        bad.base_url = good.base_url = h.openai_base  # type: ignore[assignment]
        try:
            with pytest.raises(openai.AuthenticationError) as auth:
                await bad.chat.completions.create(model="m1", messages=MSGS)  # type: ignore[arg-type]
            assert auth.value.status_code == 401
            with pytest.raises(openai.NotFoundError) as nf:
                await good.chat.completions.create(model="nope", messages=MSGS)  # type: ignore[arg-type]
            assert "does not exist" in str(nf.value)
            with pytest.raises(openai.BadRequestError) as br:
                await good.chat.completions.create(model="m1", messages=MSGS, temperature=-1)  # type: ignore[arg-type]
            assert "temperature" in str(br.value)
            # models.retrieve: the model's card; an unknown one is the SDK's NotFoundError
            card = await good.models.retrieve("m1")
            assert (card.id, card.object, card.owned_by) == ("m1", "model", "specgate")
            with pytest.raises(openai.NotFoundError) as gone:
                await good.models.retrieve("nope")
            assert gone.value.code == "model_not_found"
            with pytest.raises(openai.AuthenticationError):
                await bad.models.retrieve("m1")
        finally:
            await bad.close()
            await good.close()


async def test_sdk_stream_error_event_raises_api_error(
    make_client: Callable[..., openai.AsyncOpenAI],
) -> None:
    base = FakeEngine("m1-base", die_after_first=True)
    client = make_client()
    async with harness(base=base) as h:
        client.base_url = h.openai_base  # type: ignore[assignment]
        try:
            stream = await client.chat.completions.create(model="m1", messages=MSGS, stream=True)  # type: ignore[arg-type]
            with pytest.raises(openai.APIError) as err:
                async for _ in stream:
                    pass
            assert "broke off" in str(err.value)
        finally:
            await client.close()
