"""The EPP authenticates its peer: with ``epp.auth_token`` every gRPC stream must carry the
shared secret the bootstrap of ``specgate envoy-config`` gives Envoy (initial metadata);
others get UNAUTHENTICATED. Engine keys never go to a peer the EPP does not know: a config
with engine keys and an unauthenticated EPP is refused."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import grpc
import openai
import pytest
from aiohttp.test_utils import TestServer
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.api.app import build_app
from gateway.api.epp.server import EPP
from gateway.config import ConfigError
from gateway.envoy.bootstrap import envoy_config
from specgate_lab.emulator.launch import EmulatorGroup
from tests.conftest import gateway_config_for
from tests.epp.envoy_proc import needs_envoy, run_envoy
from tests.epp.extproc_wire import PROCESS, request_headers
from tests.epp.test_envoy_e2e import MESSAGES, client, epp_config, stack

TOKEN = "s3cret-token-of-the-epp-0123456789"


def test_engine_keys_behind_an_unauthenticated_epp_are_refused(pair: EmulatorGroup) -> None:
    keyed = {"epp.enabled": True, "models.0.pairs.0.base.api_key": "engine-key"}
    with pytest.raises(ConfigError, match=r"epp\.auth_token"):
        gateway_config_for(pair, **keyed)
    assert gateway_config_for(pair, **keyed, **{"epp.auth_token": TOKEN}).epp.authenticates
    assert gateway_config_for(pair, **{"epp.enabled": True}).epp.auth_token is None  # no keys: no need
    with pytest.raises(ConfigError, match="16 characters"):
        gateway_config_for(pair, **{"epp.enabled": True, "epp.auth_token": "short"})


def test_the_bootstrap_gives_every_grpc_service_of_the_epp_the_token(pair: EmulatorGroup) -> None:
    cfg = epp_config(pair, **{"epp.auth_token": TOKEN})
    boot = envoy_config(cfg, access_log=True, watch_share=0.5)
    services: list[dict[str, object]] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "grpc_service" in node:
                services.append(node["grpc_service"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(boot)
    assert len(services) == 3  # two ext_proc filters (the split) and the access log
    for svc in services:
        assert svc["initial_metadata"] == [{"key": "authorization", "value": f"Bearer {TOKEN}"}]
    assert "initial_metadata" not in str(envoy_config(epp_config(pair)))


async def test_a_grpc_client_without_the_token_is_unauthenticated(pair: EmulatorGroup) -> None:
    """ext_proc (and the access log) need the token; the health service, readiness only, is
    open to probes."""
    app = build_app(epp_config(pair, **{"epp.auth_token": TOKEN}))
    server = TestServer(app)
    await server.start_server()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app[EPP].port}") as ch:
            process = ch.stream_stream(PROCESS, request_serializer=None, response_deserializer=None)
            for metadata in ([], [("authorization", "Bearer wrong")]):
                call = process(metadata=metadata, timeout=10)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call.read()
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            call = process(metadata=[("authorization", f"Bearer {TOKEN}")], timeout=10)
            await call.write(request_headers())
            assert await call.read()  # an answer to the request's headers
            call.cancel()
            ok = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert ok.status in (
                health_pb2.HealthCheckResponse.SERVING,
                health_pb2.HealthCheckResponse.NOT_SERVING,
            )
        assert app[EPP].unauthenticated == 2
    finally:
        await server.close()


@needs_envoy
async def test_envoy_with_the_token_is_served_and_without_it_fails_closed(
    pair: EmulatorGroup, tmp_path: Path
) -> None:
    cfg = epp_config(pair, **{"epp.auth_token": TOKEN, "models.0.pairs.0.base.api_key": "engine-key"})
    async with stack(cfg, tmp_path) as (envoy, app):
        c = await client(envoy)
        try:
            answer = await c.chat.completions.create(
                model="qwen3-8b", messages=MESSAGES, max_tokens=4, extra_headers={"x-specgate-route": "base"}
            )
            assert answer.model == "qwen3-8b-base"
        finally:
            await c.close()
        assert app[EPP].unauthenticated == 0
        # An Envoy whose bootstrap does not carry the secret reaches the same EPP: refused.
        tokenless = epp_config(pair)
        boot = envoy_config(tokenless, listen_port=0, admin_port=0, epp_port=app[EPP].port)
        (tmp_path / "tokenless").mkdir()
        async with run_envoy(boot, tmp_path / "tokenless") as other:
            c = await client(other)
            try:
                with pytest.raises(openai.InternalServerError):
                    await c.chat.completions.create(model="qwen3-8b", messages=MESSAGES, max_tokens=4)
            finally:
                await c.close()
        assert app[EPP].unauthenticated >= 1


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture
def pki(tmp_path: Path) -> dict[str, str]:
    """A CA, the EPP's certificate (127.0.0.1) and Envoy's client certificate, both signed by it."""
    d = {k: str(tmp_path / k) for k in ("ca.crt", "ca.key", "epp.crt", "epp.key", "envoy.crt", "envoy.key")}
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
             "-keyout", d["ca.key"], "-out", d["ca.crt"])  # fmt: skip
    for name, san in (("epp", "IP:127.0.0.1,DNS:localhost"), ("envoy", "DNS:envoy")):
        csr = str(tmp_path / f"{name}.csr")
        ext = tmp_path / f"{name}.ext"
        ext.write_text(f"subjectAltName={san}\n")
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", d[f"{name}.key"],
                 "-out", csr)  # fmt: skip
        _openssl("x509", "-req", "-in", csr, "-CA", d["ca.crt"], "-CAkey", d["ca.key"], "-CAcreateserial",
                 "-days", "1", "-extfile", str(ext), "-out", d[f"{name}.crt"])  # fmt: skip
    d["ca.pem"] = Path(d["ca.crt"]).read_text()
    return d


@needs_envoy
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_envoy_reaches_the_epp_over_mtls_and_a_client_without_a_certificate_does_not(
    pair: EmulatorGroup, tmp_path: Path, pki: dict[str, str]
) -> None:
    cfg = epp_config(
        pair,
        **{
            "epp.tls_cert": pki["epp.crt"],
            "epp.tls_key": pki["epp.key"],
            "epp.tls_client_ca": pki["ca.crt"],
            "models.0.pairs.0.base.api_key": "engine-key",  # allowed: the EPP knows its peer
        },
    )
    tls = (pki["envoy.crt"], pki["envoy.key"], pki["ca.crt"])
    async with stack(cfg, tmp_path, epp_tls=tls) as (envoy, app):
        c = await client(envoy)
        try:
            answer = await c.chat.completions.create(
                model="qwen3-8b", messages=MESSAGES, max_tokens=4, extra_headers={"x-specgate-route": "base"}
            )
            assert answer.model == "qwen3-8b-base"
        finally:
            await c.close()
        # A gRPC client that trusts the EPP but shows no certificate: no handshake.
        creds = grpc.ssl_channel_credentials(root_certificates=pki["ca.pem"].encode())
        async with grpc.aio.secure_channel(f"127.0.0.1:{app[EPP].port}", creds) as ch:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
