"""``specgate demo``: an emulated engine pair on one GPU timeline plus the gateway, in one process.

Starts the pair (speculative n-gram engine on :8101, plain engine on :8102, both
emulating Qwen3-8B on one H200), the gateway on :8000 in front of them, sends a few
sample requests through the gateway and prints where each was routed and why, then
keeps serving until Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from gateway.api.app import RUNNER_KWARGS
from gateway.api.cli_serve import gateway_app, setup_logging
from gateway.api.server import GatewayRunner
from gateway.config import load_config
from gateway.physics import PROFILE_NAMES
from gateway.routing.factory import POLICY_NAMES
from gateway.wire.sse import ChatStream, StreamError
from specgate_lab.emulator.launch import EmulatorGroup, pair_launches, start_group

_CODE = """def load_users(path):
    users = []
    with open(path) as fh:
        for line in fh:
            name, email, age = line.strip().split(",")
            users.append({"name": name, "email": email, "age": int(age)})
    return users


def adults(users):
    result = []
    for user in users:
        if user["age"] >= 18:
            result.append(user)
    return result
"""

_EDIT: dict[str, Any] = {
    "messages": [
        {
            "role": "user",
            "content": "Rewrite adults() as a list comprehension and return the whole file, "
            "unchanged otherwise:\n```python\n" + _CODE + "```",
        }
    ],
    "temperature": 0,
    "max_tokens": 256,
}
_CHAT: dict[str, Any] = {
    "messages": [{"role": "user", "content": "Give me three ideas for a weekend trip in autumn."}],
    "temperature": 1.0,
    "max_tokens": 128,
}
_MIN_P: dict[str, Any] = {
    "messages": [{"role": "user", "content": "Name a colour."}],
    "temperature": 0.7,
    "min_p": 0.1,
    "max_tokens": 16,
}


def _run(label: str, body: dict[str, Any], n: int) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{label} ({i}/{n})", body) for i in range(1, n + 1)]


# A short story of changing traffic: copy-heavy edits (speculation pays), then open chat at
# T=1 (it does not: the pair falls back to the plain engine once the evidence is in), and
# one request only the plain engine accepts.
SAMPLES: list[tuple[str, dict[str, Any]]] = [
    *_run("copy-heavy code edit, T=0", _EDIT, 2),
    *_run("open chat, T=1", _CHAT, 12),
    ("min_p (the speculative engine refuses it)", _MIN_P),
]


_STORY = """\
The two engines share one device. Sent one at a time, as here, the requests find the pair
idle, and each takes the engine fastest for it (`idle_pair`): copy-heavy edits go to the
speculative engine, open chat at T=1 to the plain one. Under load both engines would be
busy, and the pair then serves one regime at a time, switching on evidence. A reason of
`prior` means nothing was measured yet.
"""


def _print_result(r: SampleResult) -> None:
    print(
        f"{r.label:45s} -> HTTP {r.status}, route={r.route} ({r.reason}), "
        f"{r.tokens} tokens in {r.seconds * 1e3:.0f} ms",
        flush=True,
    )


def configure(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.description = __doc__
    p.add_argument("--host", default="127.0.0.1", help="listen address of all three servers")
    p.add_argument("--port", type=int, default=8000, help="gateway port (default %(default)s)")
    p.add_argument(
        "--spec-port", type=int, default=8101, help="speculative engine port (default %(default)s)"
    )
    p.add_argument("--base-port", type=int, default=8102, help="plain engine port (default %(default)s)")
    p.add_argument("--profile", choices=PROFILE_NAMES, default="h200-qwen3-8b", help="step-time profile")
    p.add_argument("--time-scale", type=float, default=1.0, help="wall seconds per emulated second")
    p.add_argument(
        "--policy",
        choices=POLICY_NAMES,
        default=None,
        help="routing policy (default: the gateway's default configuration)",
    )
    p.add_argument("--once", action="store_true", help="exit after the sample requests")


@dataclass
class SampleResult:
    label: str
    status: int
    route: str | None
    reason: str | None
    engine: str | None
    tokens: int
    seconds: float


async def send_samples(
    gateway_url: str, model: str = "qwen3-8b", on_result: Callable[[SampleResult], None] | None = None
) -> list[SampleResult]:
    """Send the sample requests through the gateway (streaming), one after the other, and
    report each one's route (to ``on_result`` too, as each completes)."""
    out = []
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for label, body in SAMPLES:
            payload = {"model": model, "stream": True, "stream_options": {"include_usage": True}, **body}
            t0 = time.perf_counter()
            async with session.post(gateway_url + "/v1/chat/completions", json=payload) as r:
                stream = ChatStream()
                # The sample's line shows its status and route even when the stream broke.
                with contextlib.suppress(StreamError):
                    async for data in r.content.iter_any():
                        stream.feed(data)
                tokens = stream.completion_tokens or 0
                result = SampleResult(
                    label,
                    r.status,
                    r.headers.get("x-specgate-route"),
                    r.headers.get("x-specgate-reason"),
                    r.headers.get("x-specgate-engine"),
                    tokens,
                    time.perf_counter() - t0,
                )
                out.append(result)
                if on_result is not None:
                    on_result(result)
    return out


async def start_gateway(
    group: EmulatorGroup, host: str, port: int, policy: str | None
) -> tuple[web.AppRunner, str]:
    spec, base = group.engines
    overrides: dict[str, Any] = {
        "server.host": host,
        "server.port": port,
        "models.0.pairs.0.spec.url": spec.url,
        "models.0.pairs.0.base.url": base.url,
        "scrape.interval_s": 0.5,
    }
    if policy:
        overrides["models.0.routing.policy"] = policy
    cfg = load_config(None, env={}, overrides=overrides)
    # Built as `specgate serve` builds it: metrics, access log lines and traces as configured.
    app, telemetry = gateway_app(cfg)

    async def close_telemetry(_: web.Application) -> None:
        await telemetry.aclose()  # flush trace exporters

    app.on_cleanup.append(close_telemetry)
    runner = GatewayRunner(app, **RUNNER_KWARGS)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1] if runner.addresses else port
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return runner, f"http://{shown}:{bound}"


def _examples(url: str) -> str:
    return f"""
Try it:
  curl -sN {url}/v1/chat/completions -H 'content-type: application/json' \\
    -d '{{"model":"qwen3-8b","stream":true,"temperature":0,"messages":[{{"role":"user",
         "content":"Fix the typo and return the code: ```def ad(a,b): retrun a+b```"}}]}}' -D -

  python - <<'EOF'
  from openai import OpenAI
  client = OpenAI(base_url="{url}/v1", api_key="none")
  r = client.chat.completions.with_raw_response.create(
      model="qwen3-8b", messages=[{{"role": "user", "content": "Why is the sea salty?"}}], temperature=1.0)
  print(r.headers.get("x-specgate-route"), r.headers.get("x-specgate-reason"))
  print(r.parse().choices[0].message.content[:200])
  EOF

Force a route with the header 'x-specgate-route: spec|base'. Routing state: {url}/admin/state
Gateway metrics: {url}/metrics. Engines: /metrics on each engine port. Ctrl-C stops everything.
"""


async def run_demo(
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    spec_port: int = 8101,
    base_port: int = 8102,
    profile: str = "h200-qwen3-8b",
    time_scale: float = 1.0,
    policy: str | None = None,
    once: bool = False,
    stop: asyncio.Event | None = None,
    after_samples: Callable[[str], Awaitable[None]] | None = None,
) -> list[SampleResult]:
    """Run the demo; ``after_samples(gateway_url)`` is awaited once the samples are through."""
    group = await start_group(
        pair_launches(host=host, port_spec=spec_port, port_base=base_port, profile=profile),
        time_scale=time_scale,
    )
    runner: web.AppRunner | None = None
    try:
        runner, url = await start_gateway(group, host, port, policy)
        for e in group.engines:
            kind = "speculative (ngram, k=5)" if e.handle.engine.spec else "plain"
            print(f"engine  {e.handle.name:15s} {kind:25s} {e.url}")
        print(f"gateway qwen3-8b        {'(routes per request)':25s} {url}\n", flush=True)
        await asyncio.sleep(0.6)  # let the gateway scrape both engines once
        print(_STORY, flush=True)
        results = await send_samples(url, on_result=_print_result)
        if after_samples is not None:
            await after_samples(url)
        if once:
            return results
        print(_examples(url), flush=True)
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        return results
    finally:
        if runner is not None:
            await runner.cleanup()
        await group.stop()


def main(args: argparse.Namespace) -> int:
    if args.time_scale <= 0:
        print("error: --time-scale must be > 0", file=sys.stderr)
        return 2
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    guard = setup_logging("INFO", as_json=False)  # as `specgate serve`: access lines on stderr
    try:
        asyncio.run(
            run_demo(
                host=args.host,
                port=args.port,
                spec_port=args.spec_port,
                base_port=args.base_port,
                profile=args.profile,
                time_scale=args.time_scale,
                policy=args.policy,
                once=args.once,
            )
        )
    except OSError as e:
        print(f"error: {e} (is something already listening on the demo ports?)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    finally:
        guard.flush(final=True)  # rate-limited log lines held back in the last interval
    return 0
