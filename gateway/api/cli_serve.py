"""``specgate serve``: run the gateway."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import signal
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TextIO

from gateway.config import ConfigError, GatewayConfig
from gateway.config.loader import Origins, load_config_with_origins
from gateway.fleet.reload import ConfigSource, Reloader
from gateway.routing.factory import POLICY_NAMES
from gateway.telemetry.logguard import LogGuard
from gateway.telemetry.logguard import install as install_guard
from gateway.telemetry.logs import ACCESS_FIELDS_ATTR

if TYPE_CHECKING:
    from aiohttp import web

DESCRIPTION = """\
Run the specgate gateway: an OpenAI-compatible API (POST /v1/chat/completions,
POST /v1/completions, POST /v1/responses, GET /v1/models, GET /v1/models/{model},
and vLLM's POST /tokenize and POST /detokenize) in front of paired vLLM engines,
plus GET /health, GET /ready, GET /metrics and the admin endpoints
GET /admin/state,
GET /admin/advice (what n-gram speculation would buy on the traffic so far),
POST /admin/route (pin a model to an engine), POST /admin/drain (stop new
requests to an engine before a restart) and POST /admin/reload (re-read the
configuration, as SIGHUP does: pairs join and leave without a restart). With --epp-port it is also an
Endpoint Picker for Envoy-based gateways (Envoy's ext_proc over gRPC, the
Gateway API Inference Extension's protocol): Envoy relays the bytes and asks
specgate which engine each request goes to ('specgate envoy-config' writes a
matching Envoy bootstrap).

Configuration comes from, in increasing priority:
  1. the YAML file given by --config (or $SPECGATE_CONFIG; without either, the
     embedded default: model 'qwen3-8b' on a speculative engine at
     http://127.0.0.1:8101 and a plain one at http://127.0.0.1:8102);
  2. environment variables SPECGATE_<SECTION>__<FIELD>[__...]=value, with '__'
     separating nesting levels and list indexes, e.g.
       SPECGATE_SERVER__PORT=9000
       SPECGATE_MODELS__0__TIMEOUTS__TOTAL_S=120
       SPECGATE_MODELS__0__ROUTING__POLICY=adaptive
     plus the shortcuts SPECGATE_API_KEYS=client-key-1,client-key-2 and SPECGATE_ADMIN_KEYS=admin-key-1
     (prefer these to putting keys in files or on the command line);
  3. the flags below.
Every setting, its default and its variable: docs/config-reference.md;
--check --explain prints each effective value with the source it came from.

Admin endpoints need an admin key; when none is configured they answer only
loopback clients of a loopback listener whose requests carry no proxy header
(Forwarded, X-Forwarded-For, X-Real-IP, ...), and serve warns at start.
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--config", "-c", metavar="FILE", help="YAML configuration file")
    parser.add_argument("--host", help="listen address (server.host; default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="listen port (server.port; default 8000; 0 = any free port)")
    parser.add_argument(
        "--max-concurrency", type=int, help="requests in flight before 429 (server.max_concurrency)"
    )
    parser.add_argument(
        "--max-body-bytes", type=int, help="largest request body before 413 (server.max_body_bytes)"
    )
    parser.add_argument(
        "--policy",
        choices=POLICY_NAMES,
        help="routing policy for every model (models[*].routing.policy)",
    )
    parser.add_argument(
        "--no-scrape",
        action="store_true",
        help="do not scrape engines' /metrics and /health (scrape.enabled)",
    )
    parser.add_argument(
        "--peers",
        metavar="REDIS_URL",
        help="join this gateway's replicas through Redis (peers.url), e.g. redis://redis:6379/0: they "
        "count each other's requests, learn from each other's answers and follow one leader's regime "
        "per model. Off by default (replicas then agree through the engines' metrics)",
    )
    parser.add_argument(
        "--epp-port",
        type=int,
        metavar="PORT",
        help="also serve as an Endpoint Picker for Envoy on this port (epp.enabled, epp.port): Envoy's "
        "ext_proc gRPC protocol (Gateway API Inference Extension); Envoy relays the bytes and asks "
        "specgate which engine each request goes to. See deploy/envoy/",
    )
    parser.add_argument(
        "--epp-host", help="address of the Endpoint Picker listener (epp.host; default 127.0.0.1)"
    )
    parser.add_argument(
        "--watch-config",
        type=float,
        metavar="SECONDS",
        help="look at the configuration file every SECONDS and reload it when its bytes change "
        "(fleet.watch_config_s; default 0: off). SIGHUP and POST /admin/reload reload it anyway: "
        "pairs join and leave live, other changes are reported (docs/discovery.md)",
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR (default INFO)")
    parser.add_argument(
        "--log-json", action="store_true", default=None, help="log JSON lines (server.log_json)"
    )
    parser.add_argument(
        "--check", action="store_true", help="validate the configuration, print it (keys masked) and exit"
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="with --check (implied): print each effective setting with where its value came from "
        "(default, config file, environment variable or flag) instead of the YAML",
    )


def _overrides(args: argparse.Namespace, n_models: int) -> dict[str, Any]:
    o: dict[str, Any] = {
        "server.host": args.host,
        "server.port": args.port,
        "server.max_concurrency": args.max_concurrency,
        "server.max_body_bytes": args.max_body_bytes,
        "server.log_json": args.log_json,
        "peers.url": args.peers,
        "epp.host": args.epp_host,
        "epp.port": args.epp_port,
        "fleet.watch_config_s": getattr(args, "watch_config", None),
    }
    if args.epp_port is not None:
        o["epp.enabled"] = True
    if args.no_scrape:
        o["scrape.enabled"] = False
    if args.policy:
        for i in range(n_models):
            o[f"models.{i}.routing.policy"] = args.policy
    return o


# The flag that sets a dotted path (`_overrides`), for --explain.
_FLAGS = {
    "server.host": "--host",
    "server.port": "--port",
    "server.max_concurrency": "--max-concurrency",
    "server.max_body_bytes": "--max-body-bytes",
    "server.log_json": "--log-json",
    "peers.url": "--peers",
    "epp.host": "--epp-host",
    "epp.port": "--epp-port",
    "epp.enabled": "--epp-port",
    "fleet.watch_config_s": "--watch-config",
    "scrape.enabled": "--no-scrape",
}


def flag_of(path: str) -> str:
    """The command-line flag that set ``path`` (a dotted path of ``_overrides``)."""
    return "--policy" if path.endswith(".routing.policy") else _FLAGS.get(path, path)


def load_with_origins(args: argparse.Namespace) -> tuple[GatewayConfig, Origins]:
    cfg, origins = load_config_with_origins(args.config, overrides=_overrides(args, 0))
    if args.policy:
        cfg, origins = load_config_with_origins(args.config, overrides=_overrides(args, len(cfg.models)))
    return cfg, origins


def load_from_args(args: argparse.Namespace) -> GatewayConfig:
    return load_with_origins(args)[0]


class _Formatter(logging.Formatter):
    """``formatTime`` with the strftime part cached per second (one log line per request
    made it a visible share of the request path)."""

    _cache: tuple[int, str | None, str] = (-1, None, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        sec = int(record.created)
        cache = self._cache  # one tuple, read and replaced whole: safe from other threads
        if cache[0] != sec or cache[1] != datefmt:
            stamp = time.strftime(datefmt or self.default_time_format, self.converter(record.created))
            cache = self._cache = (sec, datefmt, stamp)
        if datefmt:
            return cache[2]
        return self.default_msec_format % (cache[2], record.msecs) if self.default_msec_format else cache[2]


class _JsonFormatter(_Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
        }
        fields = getattr(record, ACCESS_FIELDS_ATTR, None)
        if isinstance(fields, Mapping):  # an access line: its fields become keys
            out.update((k, v) for k, v in fields.items() if v is not None and k not in out)
        else:
            out["msg"] = record.getMessage()
        rid = getattr(record, "request_id", None)
        if rid:
            out["request_id"] = rid
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc"] = record.exc_text
        return json.dumps(out)


def setup_logging(level: str, as_json: bool, stream: TextIO | None = None) -> LogGuard:
    """One handler on the root logger, guarded (see :mod:`gateway.telemetry.logguard`)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    if as_json:
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(_Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    # Nothing the formats use, each costly per record: the caller's frame, thread and
    # process names (the logging HOWTO's "Optimization" settings).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    return install_guard([handler])


def config_source(args: argparse.Namespace) -> ConfigSource:
    """How a reload reads the configuration again: the same file, environment and flags."""
    import os
    from pathlib import Path

    path = args.config or os.environ.get("SPECGATE_CONFIG")
    return ConfigSource(lambda: load_from_args(args), Path(path) if path else None)


def gateway_app(
    cfg: GatewayConfig, telemetry: Any = None, source: ConfigSource | None = None
) -> tuple[web.Application, Any]:
    """The gateway application as ``specgate serve`` runs it: telemetry on as ``cfg.telemetry``
    says (Prometheus metrics, access log lines, traces per the ``OTEL_*`` environment).
    Returns the app and its telemetry (``await telemetry.aclose()`` after the runner's cleanup)."""
    from gateway.api.app import build_app
    from gateway.telemetry import build_telemetry

    if telemetry is None:
        telemetry = build_telemetry(cfg.telemetry, known_models=[m.name for m in cfg.models])
    return build_app(cfg, telemetry=telemetry, config_source=source), telemetry


async def _flush_log_summaries(guard: LogGuard) -> None:
    while True:
        await asyncio.sleep(min(1.0, guard.throttle.interval_s))
        guard.flush()


async def serve(
    cfg: GatewayConfig,
    *,
    ready: asyncio.Event | None = None,
    telemetry: Any = None,
    log_guard: LogGuard | None = None,
    source: ConfigSource | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM, then drain for ``server.shutdown_grace_s``; SIGHUP reloads
    the configuration from ``source`` (:mod:`gateway.fleet.reload`)."""
    from aiohttp import web

    from gateway.api.app import RUNNER_KWARGS
    from gateway.api.server import GatewayRunner
    from gateway.api.state import STATE

    app, telemetry = gateway_app(cfg, telemetry, source)
    # The grace period is spent in drain() below; cleanup then only closes what is left.
    runner = GatewayRunner(app, shutdown_timeout=1.0, **RUNNER_KWARGS)
    await runner.setup()
    site = web.TCPSite(runner, cfg.server.host, cfg.server.port, backlog=4096, reuse_address=True)
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    flusher = loop.create_task(_flush_log_summaries(log_guard)) if log_guard is not None else None
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    reloader = app[STATE].reloader
    if reloader is not None:
        loop.add_signal_handler(signal.SIGHUP, lambda: app[STATE].spawn(_reload(reloader)))
    addrs = runner.addresses
    port = addrs[0][1] if addrs else cfg.server.port
    # Everything allocated so far lives as long as the process: keep it out of the cyclic
    # GC's generations so collections during traffic only walk per-request garbage.
    gc.collect()
    gc.freeze()
    print(f"specgate listening on http://{cfg.server.host}:{port}", file=sys.stderr, flush=True)
    logging.getLogger("gateway").info("serving models %s", ", ".join(m.name for m in cfg.models))
    warn_open_surfaces(cfg)
    if ready is not None:
        ready.set()
    try:
        await stop.wait()
        # Graceful: keep listening so /ready answers 503 and new requests get 503, let the
        # requests in flight finish within the grace period, then close everything.
        logging.getLogger("gateway").info("draining (grace %.1fs)", cfg.server.shutdown_grace_s)
        state = app[STATE]
        if not await state.drain(cfg.server.shutdown_grace_s):
            logging.getLogger("gateway").warning(
                "grace period over with %d request(s) in flight; closing them", state.inflight
            )
            if state.cut_streams():  # let them send an error event and [DONE]
                await state.drain(1.0)
    finally:
        logging.getLogger("gateway").info("shutting down")
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.remove_signal_handler(sig)
        await runner.cleanup()
        await telemetry.aclose()  # flush trace exporters
        if flusher is not None:
            flusher.cancel()
        if log_guard is not None:
            log_guard.flush(final=True)  # what was held back in the last interval


async def _reload(reloader: Reloader) -> None:
    await reloader.reload("SIGHUP")


def warn_open_surfaces(cfg: GatewayConfig) -> None:
    """Warn at start about what anyone who reaches the port may do: admin endpoints without
    a key, and client route overrides not limited to keys (docs/security.md)."""
    from gateway.api.auth import admin_open

    log = logging.getLogger("gateway")
    if admin_open(cfg.server):
        log.warning(
            "admin endpoints (/admin/*: pins, drains) answer loopback clients without a key, "
            "since no admin key is configured: set SPECGATE_ADMIN_KEYS before putting anything "
            "that relays requests on this host in front of the gateway"
        )
    for m in cfg.models:
        if m.routing.allow_client_override and not m.routing.override_keys:
            log.warning(
                "model %s: every client may pin engines with x-specgate-route "
                "(routing.allow_client_override on, routing.override_keys empty)",
                m.name,
            )


def _masked(cfg: GatewayConfig) -> str:
    import yaml

    data = cfg.model_dump(mode="json")
    return yaml.safe_dump(data, sort_keys=False)


def main(args: argparse.Namespace) -> int:
    try:
        cfg, origins = load_with_origins(args)
    except ConfigError as exc:
        print(f"specgate: configuration error: {exc}", file=sys.stderr)
        return 2
    if getattr(args, "explain", False):
        from gateway.config.explain import explain

        print(explain(cfg, origins, flag_of), end="")
        return 0
    if args.check:
        print(_masked(cfg))
        return 0
    guard = setup_logging(args.log_level, cfg.server.log_json)
    from gateway.telemetry import build_telemetry

    try:  # the OTEL_* environment (the telemetry: section was validated with the config)
        telemetry = build_telemetry(cfg.telemetry, known_models=[m.name for m in cfg.models])
    except ValueError as exc:
        print(f"specgate: telemetry configuration error: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        runner = asyncio.Runner()
    with runner:
        try:
            runner.run(serve(cfg, telemetry=telemetry, log_guard=guard, source=config_source(args)))
        except OSError as exc:
            print(f"specgate: cannot listen on {cfg.server.host}:{cfg.server.port}: {exc}", file=sys.stderr)
            return 1
    return 0
