"""The Endpoint Picker's ext_proc service, driven as Envoy drives it, by a real gRPC client.

The gateway app runs with ``epp.enabled`` in front of an emulated pair; the client is
grpc.aio with Envoy's generated ``ExternalProcessor`` stub, sending each phase of a
request and waiting for its answer, as Envoy's ext_proc filter does.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp.test_utils import TestServer
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from gateway.api.app import build_app
from gateway.api.epp import finish
from gateway.api.epp.server import EPP
from gateway.api.state import STATE
from gateway.config import GatewayConfig
from gateway.envoy.messages import DESTINATION
from gateway.telemetry import GatewayTelemetry, TelemetryConfig
from specgate_lab.emulator.launch import EmulatorGroup
from tests.conftest import gateway_config_for
from tests.epp.extproc_wire import (
    BUFFERED,
    STREAMED,
    Response,
    parse_response,
    process_call,
    request_body,
    request_headers,
    response_body,
    response_headers,
)

TIMEOUT_S = 10.0


def chat(model: str = "qwen3-8b", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "Repeat: a b c d e f"}], **extra}


@dataclass
class Epp:
    channel: grpc.aio.Channel
    app: Any
    addr: dict[str, str]  # engine name -> ip:port
    http: str  # specgate's HTTP port: /metrics, /admin/state

    @property
    def state(self) -> Any:
        return self.app[STATE]

    @asynccontextmanager
    async def call(self) -> AsyncIterator[Call]:
        c = Call(process_call(self.channel))
        try:
            yield c
        finally:
            c.raw.cancel()


class Call:
    def __init__(self, raw: Any) -> None:
        self.raw = raw

    async def ask(self, req: bytes) -> Response:
        async with asyncio.timeout(TIMEOUT_S):
            await self.raw.write(req)
            resp = await self.raw.read()
        assert resp is not grpc.aio.EOF
        return parse_response(resp)

    async def send(self, req: bytes) -> None:
        async with asyncio.timeout(TIMEOUT_S):
            await self.raw.write(req)

    async def read(self) -> Response:
        async with asyncio.timeout(TIMEOUT_S):
            resp = await self.raw.read()
        assert resp is not grpc.aio.EOF
        return parse_response(resp)

    async def end(self) -> grpc.StatusCode:
        """Half-close as Envoy does when the response ended; the server's status."""
        async with asyncio.timeout(TIMEOUT_S):
            await self.raw.done_writing()
            code: grpc.StatusCode = await self.raw.code()
        return code


@asynccontextmanager
async def running(config: GatewayConfig, telemetry: Any = None) -> AsyncIterator[Epp]:
    app = build_app(config, telemetry=telemetry)
    server = TestServer(app)
    await server.start_server()
    epp = app[EPP]
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{epp.port}")
    try:
        addr = {e.name: epp.book.address(e.name) for e in app[STATE].engines}
        yield Epp(channel, app, addr, f"http://127.0.0.1:{server.port}")
    finally:
        await channel.close()
        await server.close()


@pytest.fixture
async def epp(pair_config: Callable[..., GatewayConfig]) -> AsyncIterator[Epp]:
    async with running(pair_config(**{"epp.enabled": True, "epp.port": 0})) as e:
        yield e


def _telemetry() -> GatewayTelemetry:
    return GatewayTelemetry(TelemetryConfig(process_metrics=False, known_models=("qwen3-8b",)))


def _same_name_config(group: EmulatorGroup) -> GatewayConfig:
    """The EPP in front of a pair whose engines both serve the client's model name."""
    return gateway_config_for(
        group,
        **{
            "epp.enabled": True,
            "epp.port": 0,
            "models.0.pairs.0.spec.served_model_name": "qwen3-8b",
            "models.0.pairs.0.base.served_model_name": "qwen3-8b",
        },
    )


async def counter(e: Epp, name: str, label: str) -> dict[str, float]:
    """The counter ``name``'s totals by ``label``, from specgate's /metrics."""
    async with aiohttp.ClientSession() as s, s.get(f"{e.http}/metrics") as resp:
        text = await resp.text()
    return {
        x.labels[label]: x.value
        for fam in text_string_to_metric_families(text)
        if fam.name == name
        for x in fam.samples
        if x.name.endswith("_total")
    }


async def _statuses(e: Epp) -> dict[str, float]:
    """specgate_requests_total by status."""
    return await counter(e, "specgate_requests", "status")


def _engine(e: Epp, name: str) -> Any:
    return next(x for x in e.state.engines if x.name == name)


async def test_a_chat_request_is_routed_with_header_metadata_and_the_engines_model_name(epp: Epp) -> None:
    async with epp.call() as c:
        r1 = await c.ask(request_headers(headers={"x-request-id": "rid-1"}))
        assert r1.kind == "request_headers"
        assert not r1.set_headers  # CONTINUE: wait for the body
        r2 = await c.ask(request_body(chat(temperature=0.0, max_tokens=8)))
        assert r2.kind == "request_body"
        hs = r2.set_headers
        dest = hs["x-gateway-destination-endpoint"]
        first = dest.split(",")[0]
        assert first in epp.addr.values()
        engine = next(n for n, a in epp.addr.items() if a == first)
        assert hs["x-request-id"] == "rid-1"
        md = r2.dynamic_metadata
        assert md["envoy.lb"]["x-gateway-destination-endpoint"] == dest
        assert md["specgate"]["engine"] == engine
        # The engines serve the model as qwen3-8b-spec / -base: the body is rewritten.
        new = json.loads(r2.body or b"")
        assert new["model"] == _engine(epp, engine).config.served_model_name
        assert "content-length" in r2.remove_headers
        # The request holds a slot on its engine until Envoy ends the stream.
        assert _engine(epp, engine).inflight == 1
        assert epp.state.inflight == 1
        r3 = await c.ask(response_headers(200, served=first))
        added = r3.set_headers
        assert added["x-specgate-route"] == md["specgate"]["route"]
        assert added["x-specgate-reason"] == md["specgate"]["reason"]
        assert added["x-request-id"] == "rid-1"
        assert added["x-specgate-engine"] == engine
        assert await c.end() == grpc.StatusCode.OK
    assert _engine(epp, engine).inflight == 0
    assert epp.state.inflight == 0


async def test_refused_parameters_never_reach_the_spec_engine_and_have_no_fallback(epp: Epp) -> None:
    for extra in ({"min_p": 0.2}, {"logit_bias": {"42": 5}}):
        async with epp.call() as c:
            await c.ask(request_headers())
            r = await c.ask(request_body(chat(temperature=0.0, **extra)))
            dest = r.set_headers["x-gateway-destination-endpoint"]
            assert dest == epp.addr["base0"], extra  # the plain engine alone: no spec fallback
            assert r.dynamic_metadata["specgate"]["reason"] == "refused_params"


async def test_errors_are_immediate_openai_responses(pair_config: Callable[..., GatewayConfig]) -> None:
    cfg = pair_config(**{"epp.enabled": True, "epp.port": 0, "server.api_keys": ["client-key-1"]})
    async with running(cfg) as e:
        cases = [
            ({}, chat(), 401, "invalid_api_key"),
            ({"authorization": "Bearer client-key-1"}, chat("no-such-model"), 404, "model_not_found"),
            ({"authorization": "Bearer client-key-1"}, chat(temperature=7), 400, None),
            ({"authorization": "Bearer client-key-1"}, b"{not json", 400, None),
        ]
        for headers, body, status, code in cases:
            async with e.call() as c:
                await c.ask(request_headers(headers=headers))
                r = await c.ask(request_body(body))
                assert r.kind == "immediate_response", (status, r)
                assert r.status == status
                err = json.loads(r.immediate_body)["error"]
                assert set(err) == {"message", "type", "param", "code"}
                if code is not None:
                    assert err["code"] == code
                hs = r.set_headers
                assert hs["content-type"] == "application/json"
        assert e.state.inflight == 0
        assert all(x.inflight == 0 for x in e.state.engines)


async def test_concurrency_limit_sheds_with_429(pair_config: Callable[..., GatewayConfig]) -> None:
    cfg = pair_config(**{"epp.enabled": True, "epp.port": 0, "server.max_concurrency": 1})
    async with running(cfg) as e, e.call() as held:
        await held.ask(request_headers())
        await held.ask(request_body(chat()))
        async with e.call() as c:
            await c.ask(request_headers())
            r = await c.ask(request_body(chat()))
            assert r.status == 429
            assert r.set_headers["retry-after"] == "1"
        assert await held.end() == grpc.StatusCode.OK
        async with e.call() as c:  # the slot is free again
            await c.ask(request_headers())
            r = await c.ask(request_body(chat()))
            assert r.kind == "request_body"


async def test_subset_hint_is_honoured(epp: Epp) -> None:
    async with epp.call() as c:
        await c.ask(request_headers(subset=[epp.addr["base0"]]))
        r = await c.ask(request_body(chat(temperature=0.0)))
        assert r.set_headers["x-gateway-destination-endpoint"] == (epp.addr["base0"])
    async with epp.call() as c:
        await c.ask(request_headers(subset=["10.9.9.9:1"]))
        r = await c.ask(request_body(chat()))
        assert r.status == 503


async def test_a_request_that_is_not_an_inference_goes_to_the_plain_engine(epp: Epp) -> None:
    async with epp.call() as c:
        r = await c.ask(request_headers("/v1/models", "GET", eos=True))
        hs = r.set_headers
        assert hs["x-gateway-destination-endpoint"] == epp.addr["base0"]
        r2 = await c.ask(response_headers(200))
        assert r2.kind == "response_headers"
        assert await c.end() == grpc.StatusCode.OK


async def test_envoy_served_the_sibling_so_the_request_counts_there(same_name_pair: EmulatorGroup) -> None:
    cfg = _same_name_config(same_name_pair)
    async with running(cfg) as epp, epp.call() as c:
        await c.ask(request_headers())
        r = await c.ask(request_body(chat(temperature=0.0)))
        dest = r.set_headers["x-gateway-destination-endpoint"]
        parts = dest.split(",")
        assert len(parts) == 2  # the sibling is allowed as fallback
        first = next(n for n, a in epp.addr.items() if a == parts[0])
        second = next(n for n, a in epp.addr.items() if a == parts[1])
        assert r.body is None  # the same name: no rewrite
        r3 = await c.ask(response_headers(200, served=parts[1]))
        added = r3.set_headers
        assert added["x-specgate-engine"] == second
        assert added["x-specgate-reason"] == "failover"  # as the proxy says of a retry on the sibling
        assert _engine(epp, second).inflight == 1
        assert _engine(epp, first).inflight == 0
        await c.end()
        assert _engine(epp, second).inflight == 0


async def test_a_sampled_answer_is_read_and_teaches_the_policy(
    epp: Epp, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Any] = []
    done = asyncio.Event()

    def record(model: Any, features: Any, decision: Any, obs: Any, **kw: Any) -> None:
        seen.append(obs)
        done.set()

    async def record_lookup(model: Any, features: Any, decision: Any, obs: Any, *a: Any, **kw: Any) -> None:
        record(model, features, decision, obs)

    monkeypatch.setattr(finish, "observe", record)
    monkeypatch.setattr(finish, "learn_with_lookup", record_lookup)
    events = [
        {"choices": [{"index": 0, "delta": {"content": w}}]} for w in ("Hello", " there", " friend")
    ] + [{"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3}}]
    sse = b"".join(b"data: " + json.dumps(ev).encode() + b"\n\n" for ev in events) + b"data: [DONE]\n\n"
    async with epp.call() as c:
        await c.ask(request_headers())
        await c.ask(request_body(chat(stream=True, temperature=0.0)))
        r = await c.ask(response_headers(200))
        assert r.response_body_mode == STREAMED
        # chunks cut mid-event, as the network cuts them
        for i, piece in enumerate((sse[:30], sse[30:100], sse[100:])):
            rb = await c.ask(response_body(piece, eos=i == 2))
            assert rb.kind == "response_body"
        assert await c.end() == grpc.StatusCode.OK
    async with asyncio.timeout(TIMEOUT_S):
        await done.wait()
    obs = seen[0]
    assert obs.ok and obs.complete
    assert obs.harvest.completion_tokens == 3
    assert obs.harvest.content_events == 3
    assert obs.first_token_at is not None and obs.last_token_at >= obs.first_token_at


async def test_a_stream_cut_by_envoy_releases_its_slot(epp: Epp) -> None:
    async with epp.call() as c:
        await c.ask(request_headers())
        await c.ask(request_body(chat()))
        assert epp.state.inflight == 1
        c.raw.cancel()
    # The server sees the RST_STREAM on a later loop turn: drain() waits for the count to reach 0.
    assert await epp.state.drain(TIMEOUT_S)
    assert all(x.inflight == 0 for x in epp.state.engines)


async def test_full_duplex_mode_answers_headers_after_the_whole_body(epp: Epp) -> None:
    async with epp.call() as c:
        await c.send(request_headers(full_duplex=True))
        await c.send(request_body(b'{"model": "qwen3-8b", "messages": [{"role": "user",', eos=False))
        await c.send(request_body(b' "content": "hi"}], "temperature": 0}', eos=True))
        r1 = await c.read()
        assert r1.kind == "request_headers"
        hs = r1.set_headers
        assert hs["x-gateway-destination-endpoint"].split(",")[0] in epp.addr.values()
        r2 = await c.read()
        assert r2.streamed is not None
        body, end = r2.streamed
        assert end
        assert json.loads(body)["model"].startswith("qwen3-8b-")


async def test_a_body_sent_without_waiting_is_answered_after_the_headers(
    epp: Epp, same_name_pair: EmulatorGroup
) -> None:
    """STREAMED with send_body_without_waiting_for_header_response: the pieces of the body
    come before the headers are answered; nothing is answered until the last, then the
    headers (with the pick) and each piece in order: a new body (the engine's model name)
    replaces the last piece and the earlier ones are dropped."""
    body = json.dumps(chat(temperature=0.0)).encode()
    async with epp.call() as c:
        await c.send(request_headers(streamed=True, without_waiting=True))
        await c.send(request_body(body[:10], eos=False))
        await c.send(request_body(body[10:], eos=False))
        await c.send(request_body(b"", eos=True))
        answers = [await c.read() for _ in range(4)]
        assert [a.kind for a in answers] == ["request_headers", *["request_body"] * 3]
        first = answers[0]
        assert first.set_headers[DESTINATION].split(",")[0] in epp.addr.values()
        assert first.mode == {}  # Envoy ignores mode overrides here: none is sent
        assert "content-length" in first.remove_headers  # the body is replaced
        assert [a.clear_body for a in answers[1:3]] == [True, True]
        new = json.loads(answers[3].body or b"")
        engine = next(n for n, a in epp.addr.items() if a == first.set_headers[DESTINATION].split(",")[0])
        assert new["model"] == _engine(epp, engine).config.served_model_name
        assert await c.end() == grpc.StatusCode.OK
    assert epp.state.inflight == 0
    # Engines serving the client's name: every piece passes as it is.
    cfg = _same_name_config(same_name_pair)
    async with running(cfg) as e, e.call() as c:
        await c.send(request_headers(streamed=True, without_waiting=True))
        await c.send(request_body(body, eos=False))
        await c.send(request_body(b"", eos=True))
        answers = [await c.read() for _ in range(3)]
        assert [a.kind for a in answers] == ["request_headers", "request_body", "request_body"]
        assert "content-length" not in answers[0].remove_headers
        assert all(a.body is None and not a.clear_body for a in answers[1:])


async def test_streamed_pieces_are_answered_one_by_one_when_envoy_waits(epp: Epp) -> None:
    body = json.dumps(chat(temperature=0.0)).encode()
    async with epp.call() as c:
        assert (await c.ask(request_headers(streamed=True))).kind == "request_headers"
        piece = await c.ask(request_body(body[:10], eos=False))
        assert piece.kind == "request_body" and not piece.set_headers  # CONTINUE: kept
        routed = await c.ask(request_body(body[10:], eos=True))
        assert routed.set_headers[DESTINATION].split(",")[0] in epp.addr.values()


async def test_health_follows_readiness_and_draining(epp: Epp) -> None:
    stub = health_pb2_grpc.HealthStub(epp.channel)
    serving = health_pb2.HealthCheckResponse.SERVING
    for name in ("", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
        r = await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=TIMEOUT_S)
        assert r.status == serving, name
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=TIMEOUT_S)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    epp.state.draining = True
    r = await stub.Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=TIMEOUT_S)
    assert r.status == health_pb2.HealthCheckResponse.NOT_SERVING
    r = await stub.Check(health_pb2.HealthCheckRequest(service="liveness"), timeout=TIMEOUT_S)
    assert r.status == serving
    async with epp.call() as c:  # draining: new requests get 503
        await c.ask(request_headers())
        r2 = await c.ask(request_body(chat()))
        assert r2.status == 503


async def test_metrics_and_admin_state_count_what_the_epp_routed(
    pair_config: Callable[..., GatewayConfig],
) -> None:
    cfg = pair_config(**{"epp.enabled": True, "epp.port": 0})
    async with running(cfg, _telemetry()) as e:
        for extra, status in (({"min_p": 0.3}, 200), ({"min_p": 0.3}, 503)):
            async with e.call() as c:
                await c.ask(request_headers())
                await c.ask(request_body(chat(**extra)))
                await c.ask(response_headers(status))
                await c.end()
        async with e.call() as c:  # refused: counted with its error
            await c.ask(request_headers())
            await c.ask(request_body(chat("no-such-model")))
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{e.http}/metrics") as r:
                text = await r.text()
            async with s.get(f"{e.http}/admin/state") as r:
                state = await r.json()
    samples = {
        (x.labels.get("route"), x.labels.get("reason"), x.labels.get("status")): x.value
        for fam in text_string_to_metric_families(text)
        if fam.name == "specgate_requests"
        for x in fam.samples
        if x.name.endswith("_total")
    }
    assert samples[("base", "refused_params", "200")] == 1
    assert samples[("base", "refused_params", "503")] == 1
    assert samples[("none", "none", "404")] == 1
    base = state["models"]["qwen3-8b"]["pairs"][0]["base"]
    assert base["total_requests"] == 2 and base["inflight"] == 0
    assert base["total_failures"] == 1  # the 503 the engine answered counts against it


async def test_a_bounded_share_of_answers_is_watched_and_the_rest_relayed_unseen(
    pair_config: Callable[..., GatewayConfig],
) -> None:
    """The answer to the request headers asks Envoy for the response headers of a bounded
    share of requests (``epp.observe_per_s`` a second per model; the bootstrap skips them
    otherwise); an unwatched request still holds its slot until Envoy ends the stream and is
    counted with the status ``unobserved``, never as an error."""
    # A budget of one watched answer, refilled after 1000 s: the second request is not watched.
    cfg = pair_config(**{"epp.enabled": True, "epp.port": 0, "epp.observe_per_s": 0.001})
    async with running(cfg, _telemetry()) as e:
        async with e.call() as c:
            r = await c.ask(request_headers())
            # response headers SEND; the request's own modes restated (headers SEND, body
            # BUFFERED as the filter said, trailers SKIP); the response body left off
            assert r.mode == {1: 1, 2: 1, 3: BUFFERED, 5: 2, 6: 2}
            await c.ask(request_body(chat(temperature=0.0)))
            r3 = await c.ask(response_headers(200))
            assert "x-specgate-route" in r3.set_headers
            assert await c.end() == grpc.StatusCode.OK
        async with e.call() as c:
            r = await c.ask(request_headers())
            assert r.kind == "request_headers" and r.mode == {}  # plain CONTINUE: not watched
            routed = await c.ask(request_body(chat(temperature=0.0)))
            engine = next(n for n, a in e.addr.items() if a == routed.set_headers[DESTINATION].split(",")[0])
            assert _engine(e, engine).inflight == 1
            assert await c.end() == grpc.StatusCode.OK  # the response ended, unseen
        assert _engine(e, engine).inflight == 0 and e.state.inflight == 0
        assert _engine(e, engine).total_failures == 0
        assert await _statuses(e) == {"200": 1, "unobserved": 1}


async def test_an_unwatched_stream_cut_by_envoy_counts_as_a_client_disconnect(
    pair_config: Callable[..., GatewayConfig],
) -> None:
    cfg = pair_config(**{"epp.enabled": True, "epp.port": 0, "epp.observe_per_s": 0})
    async with running(cfg, _telemetry()) as e:
        async with e.call() as c:
            assert (await c.ask(request_headers())).mode == {}
            await c.ask(request_body(chat()))
            c.raw.cancel()  # Envoy resets the stream (the client went away)
        assert await e.state.drain(TIMEOUT_S)  # the RST_STREAM is seen on a later loop turn
        assert await _statuses(e) == {"499": 1}


async def test_a_one_trip_stream_reset_once_answered_is_unobserved_not_a_disconnect(
    pair_config: Callable[..., GatewayConfig],
) -> None:
    """STREAMED with the body sent without waiting: Envoy resets the stream as soon as it
    has the answers (it sends nothing more there), so the reset after the routing is the
    end of the EPP's part: counted unobserved, no error, the slot released. A reset before
    the routing (the upload cut) counts nothing, as on the other paths."""
    cfg = pair_config(**{"epp.enabled": True, "epp.port": 0})
    async with running(cfg, _telemetry()) as e:
        # One channel, one connection: the first stream's reset is read before the second's frames.
        async with e.call() as c:
            await c.send(request_headers(streamed=True, without_waiting=True))
            await c.send(request_body(b'{"model": "qwen3-8b", "mess', eos=False))
            c.raw.cancel()  # the upload cut before the body ended: nothing routed
        async with e.call() as c:
            await c.send(request_headers(streamed=True, without_waiting=True))
            await c.send(request_body(chat(temperature=0.0)))
            assert [(await c.read()).kind for _ in range(2)] == ["request_headers", "request_body"]
            assert e.state.inflight == 1
            c.raw.cancel()  # Envoy's reset once the request is answered
        assert await e.state.drain(TIMEOUT_S)  # the reset is read on a later loop turn
        assert await _statuses(e) == {"unobserved": 1}
        assert all(x.total_failures == 0 for x in e.state.engines)


@pytest.fixture
def tls_pair(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 'localhost' (openssl)."""
    cert, key = tmp_path / "epp.crt", tmp_path / "epp.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_the_epp_serves_over_tls(
    pair_config: Callable[..., GatewayConfig], tls_pair: tuple[Path, Path]
) -> None:
    cert, key = tls_pair
    cfg = pair_config(
        **{"epp.enabled": True, "epp.port": 0, "epp.tls_cert": str(cert), "epp.tls_key": str(key)}
    )
    app = build_app(cfg)
    server = TestServer(app)
    await server.start_server()
    creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    channel = grpc.aio.secure_channel(f"127.0.0.1:{app[EPP].port}", creds)
    try:
        c = Call(process_call(channel))
        await c.ask(request_headers())
        r = await c.ask(request_body(chat(min_p=0.5)))
        assert r.set_headers["x-gateway-destination-endpoint"]
        assert await c.end() == grpc.StatusCode.OK
    finally:
        await channel.close()
        await server.close()


async def test_a_routed_stream_may_stay_silent_but_its_slot_is_bounded(
    pair_config: Callable[..., GatewayConfig],
) -> None:
    """Before routing, a stream that owes its body is ended after ``epp.message_timeout_s``;
    after, the stream lasts as long as the response (ending it would cut the client's
    answer), and the slot is released past the model's ``timeouts.total_s``."""
    cfg = pair_config(
        **{"epp.enabled": True, "epp.port": 0, "epp.message_timeout_s": 5, "models.0.timeouts.total_s": 30}
    )
    async with running(cfg) as e, e.call() as routed, e.call() as waiting:
        await routed.ask(request_headers())
        await routed.ask(request_body(chat()))
        await waiting.ask(request_headers())  # its body never comes
        server = e.app[EPP]
        (conn,) = server.connections
        later = max(s.last_activity for s in conn.streams.values()) + 10
        conn.expire(later, 5)
        assert len(conn.streams) == 1  # the waiting one ended, the routed one stays
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await waiting.read()
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        (stream,) = conn.streams.values()
        assert e.state.inflight == 1
        assert not stream.handler.overdue(later)  # within total_s
        assert stream.handler.overdue(later + 60)  # past it: the slot goes, the stream stays
        assert e.state.inflight == 0 and all(x.inflight == 0 for x in e.state.engines)
        assert len(conn.streams) == 1
        await routed.ask(response_headers(200))
        assert await routed.end() == grpc.StatusCode.OK  # ends normally, counted once
        assert e.state.inflight == 0
