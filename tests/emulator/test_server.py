"""The emulated vLLM server speaks OpenAI/vLLM exactly where clients and the gateway look."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.cli import main as cli_main
from gateway.text import tokenize
from specgate_lab.emulator.launch import EmulatorGroup
from tests.emulator.prompts import CHATS, EDITS
from tests.emulator.sdk import sdk_client

pytestmark = pytest.mark.timeout(60)


async def _sse(session: aiohttp.ClientSession, url: str, body: dict[str, object]) -> tuple[int, list[str]]:
    async with session.post(url, json=body) as r:
        raw = (await r.read()).decode()
    events = [e[len("data: ") :] for e in raw.split("\n\n") if e]
    assert all(e for e in events)
    return r.status, events


async def _state(session: aiohttp.ClientSession, url: str) -> dict[str, object]:
    async with session.get(url + "/_emulator/state") as r:
        return dict(await r.json())


async def test_openai_sdk_streams_chat_with_role_multi_token_deltas_and_usage(pair: EmulatorGroup) -> None:
    spec_url = pair.urls[0]
    async with sdk_client(spec_url) as client:
        stream = await client.chat.completions.create(
            model="qwen3-8b-spec",
            messages=[{"role": "user", "content": EDITS[0]}],
            temperature=0,
            max_tokens=300,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish in (["stop"], ["length"])
    assert any(len(tokenize(t)) > 1 for t in content), "accepted drafts arrive as multi-token deltas"
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == [] and usage_chunk.usage is not None
    # (re-tokenizing the joined text may merge a few whitespace tokens)
    assert usage_chunk.usage.completion_tokens == pytest.approx(len(tokenize("".join(content))), rel=0.05)
    extra = usage_chunk.model_extra or {}
    sd = extra["metrics"]["speculative_decoding"]
    assert sd["mean_acceptance_length"] > 2.0 and sd["num_drafts"] > 0


async def test_openai_sdk_completions_unary_and_sync_client(pair: EmulatorGroup) -> None:
    base_url = pair.urls[1]
    async with sdk_client(base_url) as client:
        resp = await client.completions.create(model="qwen3-8b-base", prompt=CHATS[0], max_tokens=7)
    assert resp.object == "text_completion"
    assert resp.choices[0].finish_reason == "length"
    assert resp.usage is not None and resp.usage.completion_tokens == 7
    assert len(tokenize(resp.choices[0].text)) == 7

    def sync_call() -> str:
        with openai.OpenAI(base_url=base_url + "/v1", api_key="none", max_retries=0) as c:
            r = c.chat.completions.create(
                model="qwen3-8b-base", messages=[{"role": "user", "content": "hi"}], max_tokens=5
            )
            return r.choices[0].message.content or ""

    assert await asyncio.to_thread(sync_call)


async def test_raw_sse_ends_with_done_and_n_choices(pair: EmulatorGroup) -> None:
    async with aiohttp.ClientSession() as s:
        status, events = await _sse(
            s,
            pair.urls[1] + "/v1/completions",
            {"prompt": CHATS[1], "max_tokens": 5, "n": 2, "stream": True, "temperature": 1.0},
        )
    assert status == 200
    assert events[-1] == "[DONE]"
    bodies = [json.loads(e) for e in events[:-1]]
    assert {b["choices"][0]["index"] for b in bodies} == {0, 1}
    assert sum(1 for b in bodies if b["choices"][0]["finish_reason"] == "length") == 2
    assert all(b["object"] == "text_completion" and b["id"].startswith("cmpl-") for b in bodies)


async def test_min_p_and_logit_bias_refused_by_spec_engine_only(pair: EmulatorGroup) -> None:
    spec_url, base_url = pair.urls
    async with sdk_client(spec_url) as client:
        with pytest.raises(openai.BadRequestError) as ei:
            await client.completions.create(
                model="qwen3-8b-spec", prompt="hi", max_tokens=3, extra_body={"min_p": 0.1}
            )
    assert ei.value.status_code == 400
    body = ei.value.body
    assert isinstance(body, dict) and body["type"] == "BadRequestError" and body["code"] == 400
    async with aiohttp.ClientSession() as s:
        status, events = await _sse(
            s,
            spec_url + "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"11": 5}, "stream": True},
        )
        assert status == 200
        assert json.loads(events[0])["error"]["code"] == 400
        assert events[-1] == "[DONE]" and len(events) == 2
        async with s.post(
            base_url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3, "min_p": 0.1}
        ) as r:
            assert r.status == 200


@pytest.mark.parametrize(
    "body,status",
    [
        ({"model": "nope", "prompt": "hi"}, 404),
        ({"prompt": "hi", "temperature": -1}, 400),
        ({"prompt": "hi", "max_tokens": 0}, 400),
        ({"prompt": "hi", "n": "2"}, 400),
        ({"prompt": 5}, 400),
        ({"prompt": "word " * 5000, "max_tokens": 10}, 400),
        ({"prompt": "hi", "stream_options": {"include_usage": True}}, 400),
    ],
)
async def test_bad_requests_get_openai_error_bodies(
    pair: EmulatorGroup, body: dict[str, object], status: int
) -> None:
    async with aiohttp.ClientSession() as s, s.post(pair.urls[1] + "/v1/completions", json=body) as r:
        assert r.status == status
        err = (await r.json())["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == status


async def test_invalid_json_models_health_version(pair: EmulatorGroup) -> None:
    url = pair.urls[0]
    async with aiohttp.ClientSession() as s:
        async with s.post(url + "/v1/chat/completions", data=b"{not json") as r:
            assert r.status == 400
        async with s.get(url + "/v1/models") as r:
            models = await r.json()
        assert models["data"][0]["id"] == "qwen3-8b-spec" and models["data"][0]["max_model_len"] == 4096
        async with s.get(url + "/health") as r:
            assert r.status == 200
        async with s.get(url + "/version") as r:
            assert "version" in await r.json()


async def test_client_disconnect_aborts_and_frees_the_slot(pair: EmulatorGroup) -> None:
    url = pair.urls[1]
    async with aiohttp.ClientSession() as s:
        resp = await s.post(
            url + "/v1/completions",
            json={"prompt": "hi", "max_tokens": 3000, "ignore_eos": True, "stream": True},
        )
        await resp.content.readline()  # first event arrived: the request is running
        assert (await _state(s, url))["running"] == 1
        resp.close()  # client goes away
        for _ in range(200):
            st = await _state(s, url)
            if st["running"] == 0:
                break
            await asyncio.sleep(0.01)
        assert st["running"] == 0
        assert st["finished"]["abort"] == 1  # type: ignore[index]
        async with s.get(url + "/metrics") as r:
            page = await r.text()
    fams = {f.name: f for f in text_string_to_metric_families(page)}
    aborts = [
        x.value for x in fams["vllm:request_success"].samples if x.labels.get("finished_reason") == "abort"
    ]
    assert aborts == [1.0]


async def test_metrics_page_parses_and_counts_spec_work(pair: EmulatorGroup) -> None:
    spec_url = pair.urls[0]
    async with aiohttp.ClientSession() as s:
        async with s.post(
            spec_url + "/v1/completions", json={"prompt": EDITS[1], "max_tokens": 100, "temperature": 0}
        ) as r:
            body = await r.json()
        assert body["metrics"]["speculative_decoding"]["num_draft_tokens"] > 0
        async with s.get(spec_url + "/metrics") as r:
            assert r.headers["Content-Type"].startswith("text/plain")
            page = await r.text()
    fams = {f.name: f for f in text_string_to_metric_families(page)}
    drafts = fams["vllm:spec_decode_num_drafts"].samples[0].value
    assert drafts == body["metrics"]["speculative_decoding"]["num_drafts"]
    gen = [x.value for x in fams["vllm:generation_tokens"].samples if x.name.endswith("_total")]
    assert gen == [body["usage"]["completion_tokens"]]


async def test_fault_knobs_at_run_time(pair: EmulatorGroup) -> None:
    url = pair.urls[1]
    async with aiohttp.ClientSession() as s:
        async with s.post(url + "/_emulator/faults", json={"error_rate": 1.0, "garbage_metrics": True}) as r:
            assert r.status == 200
        async with s.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}) as r:
            assert r.status == 500
            assert (await r.json())["error"]["code"] == 500
        async with s.get(url + "/metrics") as r:
            page = await r.text()
        with pytest.raises(ValueError):
            list(text_string_to_metric_families(page))
        async with s.post(url + "/_emulator/faults", json={"bogus": 1}) as r:
            assert r.status == 400
        async with s.post(
            url + "/_emulator/faults", json={"error_rate": 0, "garbage_metrics": False, "hang": "accept"}
        ) as r:
            assert r.status == 200
        hung = asyncio.ensure_future(s.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}))
        done, _ = await asyncio.wait({hung}, timeout=0.3)
        assert not done, "hang=accept must not answer"
        async with s.post(url + "/_emulator/faults", json={"hang": "none"}) as r:
            assert r.status == 200
        resp = await hung
        assert resp.status == 200
        resp.close()


async def test_crash_mid_stream_cuts_connection_and_closes_port(pair: EmulatorGroup) -> None:
    url = pair.urls[1]
    async with aiohttp.ClientSession() as s:
        async with s.post(
            url + "/_emulator/faults",
            json={"crash_after_requests": 0, "crash_mid_stream": True, "mid_stream_chunks": 2},
        ) as r:
            assert r.status == 200
        got: list[bytes] = []
        with pytest.raises(aiohttp.ClientError):
            async with s.post(
                url + "/v1/completions",
                json={"prompt": "hi", "max_tokens": 500, "ignore_eos": True, "stream": True},
            ) as r:
                async for line in r.content:
                    got.append(line)
        assert got and b"[DONE]" not in b"".join(got)
        with pytest.raises(aiohttp.ClientConnectionError):
            async with s.get(url + "/health") as r:
                pass
    # the other engine of the pair lives on
    async with aiohttp.ClientSession() as s, s.get(pair.urls[0] + "/health") as r:
        assert r.status == 200


def test_cli_rejects_unknown_speculative_keys(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(
        ["emulate", "--speculative-config", '{"method":"ngram","num_speculative_tokens":5,"bogus":1}']
    )
    assert rc == 2
    assert "bogus" in capsys.readouterr().err


async def test_crash_drops_keepalive_connections_and_restart_resets_counters(pair: EmulatorGroup) -> None:
    base = pair.engines[1]
    async with aiohttp.ClientSession() as s:
        async with s.post(base.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 4}) as r:
            assert r.status == 200
        async with s.get(base.url + "/health") as r:  # a pooled keep-alive connection now exists
            assert r.status == 200
        await base.handle.crash()
        with pytest.raises(aiohttp.ClientConnectionError):
            async with s.get(base.url + "/health") as r:
                pass
        port = base.port
        await base.restart()
        assert base.port == port and not base.handle.dead
        async with s.get(base.url + "/metrics") as r:
            page = await r.text()
        fams = {f.name: f for f in text_string_to_metric_families(page)}
        gen = [x.value for x in fams["vllm:generation_tokens"].samples if x.name.endswith("_total")]
        assert gen == [0.0], "a restarted engine starts its counters from zero"
        async with s.post(base.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 4}) as r:
            assert r.status == 200
    # the restarted engine still shares the device with its sibling
    assert base.handle.driver.device.engines == [pair.engines[0].handle.engine, base.handle.engine]


async def test_slow_metrics_fault_delays_the_scrape(pair: EmulatorGroup) -> None:
    url = pair.urls[0]
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as s:
        async with s.post(url + "/_emulator/faults", json={"metrics_delay_s": 0.3}) as r:
            assert r.status == 200
        t0 = loop.time()
        async with s.get(url + "/metrics") as r:
            assert r.status == 200 and "vllm:num_requests_running" in await r.text()
        assert loop.time() - t0 >= 0.3
        with pytest.raises(asyncio.TimeoutError):
            async with s.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=0.1)) as r:
                await r.text()


async def test_tokenize_and_continue_final_message_continue_the_same_answer(pair: EmulatorGroup) -> None:
    """As vLLM: ``/tokenize`` counts a text's tokens, and a chat request whose last message
    is the assistant's, with ``continue_final_message``, continues that message. At T=0 the
    plain engine continues the spec engine's own answer word for word."""
    spec_url, base_url = pair.urls
    messages: list[dict[str, str]] = [{"role": "user", "content": EDITS[0]}]
    async with aiohttp.ClientSession() as s:
        body = {"model": "qwen3-8b-spec", "messages": messages, "temperature": 0, "max_tokens": 120}
        async with s.post(spec_url + "/v1/chat/completions", json={**body, "ignore_eos": True}) as r:
            whole = (await r.json())["choices"][0]["message"]["content"]
        toks = tokenize(whole)
        head = "".join(toks[:40])
        async with s.post(base_url + "/tokenize", json={"model": "qwen3-8b-base", "prompt": head}) as r:
            counted = await r.json()
        assert counted["count"] == len(tokenize(head)) == len(counted["tokens"])
        cont = {
            "model": "qwen3-8b-base",
            "messages": [*messages, {"role": "assistant", "content": head}],
            "temperature": 0,
            "max_tokens": 120 - counted["count"],
            "ignore_eos": True,
            "add_generation_prompt": False,
            "continue_final_message": True,
        }
        async with s.post(base_url + "/v1/chat/completions", json=cont) as r:
            rest = await r.json()
        assert head + rest["choices"][0]["message"]["content"] == whole
        assert rest["usage"]["completion_tokens"] == 120 - counted["count"]
        # both flags on is a client error, as in vLLM
        async with s.post(
            base_url + "/v1/chat/completions", json={**cont, "add_generation_prompt": True}
        ) as r:
            assert r.status == 400 and "continue_final_message" in (await r.json())["error"]["message"]
        async with s.post(base_url + "/tokenize", json={"model": "other", "prompt": "x"}) as r:
            assert r.status == 404
