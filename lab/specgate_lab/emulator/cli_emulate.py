"""``specgate emulate``: a GPU-free vLLM OpenAI server (or a spec+base pair on one GPU timeline)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from typing import Any

from gateway.physics import PROFILE_NAMES
from specgate_lab.emulator.engine import EngineConfig
from specgate_lab.emulator.engine_types import REASONING_FIELDS, REASONING_PARSER_MODES, REASONING_PARSERS
from specgate_lab.emulator.faults import Faults
from specgate_lab.emulator.launch import (
    PAIR_SPEC_CONFIG,
    EngineLaunch,
    load_config,
    pair_launches,
    start_group,
)
from specgate_lab.emulator.spec import SpecConfigError, parse_spec_config

EPILOG = """\
examples:
  # one speculative engine, like `vllm serve`
  specgate emulate --model Qwen/Qwen3-8B --served-model-name qwen3-8b-spec --port 8101 \\
      --speculative-config '{"method":"ngram","num_speculative_tokens":5,
                             "prompt_lookup_min":2,"prompt_lookup_max":5}'
  # the pair the gateway fronts: spec on :8101, plain on :8102, one H200 timeline
  specgate emulate --pair
  # several engines from a YAML file (engines naming the same device share its timeline)
  specgate emulate --config engines.yaml

Faults can also be changed while running:
  curl -X POST localhost:8101/_emulator/faults -d '{"error_rate": 0.1}'
Timings (and every latency on /metrics) are in emulated time; --time-scale 4 runs
emulated time 4x slower than the wall clock so a busy CPU keeps up.
"""


def configure(p: argparse.ArgumentParser) -> None:
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = EPILOG
    g = p.add_argument_group("engine (vLLM-compatible flags)")
    g.add_argument(
        "--model", default="Qwen/Qwen3-8B", help="model name reported as root (default %(default)s)"
    )
    g.add_argument("--served-model-name", default=None, help="name clients use (default: --model)")
    g.add_argument(
        "--speculative-config",
        default=None,
        help="vLLM speculative config JSON, e.g. '" + PAIR_SPEC_CONFIG + "' (unknown keys are rejected)",
    )
    g.add_argument("--max-num-seqs", type=int, default=256, help="running batch limit (default %(default)s)")
    g.add_argument("--max-model-len", type=int, default=4096, help="context limit (default %(default)s)")
    g.add_argument(
        "--max-num-batched-tokens", type=int, default=8192, help="tokens per step (default %(default)s)"
    )
    g.add_argument(
        "--num-gpu-blocks-override",
        type=int,
        default=4185,
        help="KV cache blocks of 16 tokens (default %(default)s: a Qwen3-8B engine at 0.42 of an H200)",
    )
    g.add_argument("--host", default="127.0.0.1", help="bind address (default %(default)s)")
    g.add_argument("--port", type=int, default=8000, help="port (default %(default)s)")
    g.add_argument("--seed", type=int, default=0, help="seed of generated text (default %(default)s)")
    g.add_argument("--disable-log-stats", action="store_true", help="serve no vllm:* metrics, as vLLM does")
    g.add_argument(
        "--per-request-spec-decode-metrics",
        choices=["none", "summary"],
        default="none",
        help="'summary' adds metrics.speculative_decoding to responses (vLLM >= 0.29)",
    )
    g.add_argument(
        "--reasoning-parser",
        choices=list(REASONING_PARSERS),
        default=None,
        help="a thinking model: <think> reasoning </think> before the content, the reasoning "
        "apart in chat answers (default: none, as vLLM)",
    )
    g.add_argument(
        "--reasoning-field",
        choices=list(REASONING_FIELDS),
        default="reasoning",
        help="the chat field of the reasoning: newer vLLM's 'reasoning' or older 'reasoning_content' "
        "(default %(default)s)",
    )
    g.add_argument(
        "--reasoning-parser-mode",
        choices=list(REASONING_PARSER_MODES),
        default="prompt-aware",
        help="prompt-aware (newer vLLM: a prompt whose think block ended makes all output content) or "
        "generated-only (older: all output before a </think> of its own is reasoning) "
        "(default %(default)s)",
    )
    e = p.add_argument_group("emulation")
    e.add_argument(
        "--profile",
        type=_profile_arg,
        default="h200-qwen3-8b",
        help=f"step-time profile: {', '.join(PROFILE_NAMES)}, or a fitted profile's .json "
        "(default %(default)s)",
    )
    e.add_argument(
        "--spec-cost-scale",
        type=float,
        default=1.0,
        help="what speculation adds to a step (verifying drafts, drafting) as a multiple of the "
        "profile's price: an engine whose truth differs from the profile the gateway assumes "
        "(default %(default)s)",
    )
    e.add_argument(
        "--device-scale",
        type=float,
        default=1.0,
        help="every step x this, both engines alike: another GPU than the profile's (default %(default)s)",
    )
    e.add_argument("--device", default="gpu0", help="device timeline name; engines on one device share it")
    e.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="wall seconds per emulated second (default 1; with --config, overrides its time_scale)",
    )
    e.add_argument(
        "--pair", action="store_true", help="start a spec+base pair on one device (ports 8101/8102)"
    )
    e.add_argument("--spec-port", type=int, default=8101, help="--pair: port of the speculative engine")
    e.add_argument("--base-port", type=int, default=8102, help="--pair: port of the plain engine")
    e.add_argument("--config", default=None, help="YAML file listing engines (see the module docs)")
    f = p.add_argument_group("faults")
    f.add_argument("--startup-delay", type=float, default=0.0, help="seconds before the port opens")
    f.add_argument("--crash-after", type=int, default=None, help="die when request N+1 arrives")
    f.add_argument("--crash-mid-stream", action="store_true", help="with --crash-after: die mid-stream")
    f.add_argument("--hang", choices=["none", "accept", "mid_stream"], default="none", help="hang requests")
    f.add_argument("--metrics-delay", type=float, default=0.0, help="seconds /metrics takes to answer")
    f.add_argument("--garbage-metrics", action="store_true", help="/metrics returns unparseable text")
    f.add_argument("--error-rate", type=float, default=0.0, help="share of requests answered with HTTP 500")


def _profile_arg(value: str) -> str:
    """A shipped profile's name, or an existing fitted profile file (``*.json``)."""
    if value in PROFILE_NAMES or (value.endswith(".json") and os.path.isfile(value)):
        return value
    raise argparse.ArgumentTypeError(
        f"{value!r}: one of {', '.join(PROFILE_NAMES)}, or a fitted profile's .json"
    )


def _faults(args: argparse.Namespace) -> Faults:
    return Faults(
        startup_delay_s=args.startup_delay,
        crash_after_requests=args.crash_after,
        crash_mid_stream=args.crash_mid_stream,
        hang=args.hang,
        metrics_delay_s=args.metrics_delay,
        garbage_metrics=args.garbage_metrics,
        error_rate=args.error_rate,
    )


def _reasoning(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "reasoning_parser": args.reasoning_parser,
        "reasoning_field": args.reasoning_field,
        "reasoning_parser_mode": args.reasoning_parser_mode,
    }


def build_launches(args: argparse.Namespace) -> tuple[list[EngineLaunch], float]:
    if args.config:
        launches, yaml_scale = load_config(args.config)
        return launches, yaml_scale if args.time_scale is None else args.time_scale
    faults = _faults(args)
    if args.pair:
        launches = pair_launches(
            host=args.host,
            port_spec=args.spec_port,
            port_base=args.base_port,
            speculative_config=args.speculative_config or PAIR_SPEC_CONFIG,
            profile=args.profile,
            max_num_seqs=args.max_num_seqs,
            max_model_len=args.max_model_len,
            seed=args.seed,
            device=args.device,
            per_request_metrics=args.per_request_spec_decode_metrics == "summary",
            num_gpu_blocks=args.num_gpu_blocks_override,
            spec_cost_scale=args.spec_cost_scale,
            device_scale=args.device_scale,
            **_reasoning(args),
        )
        for ln in launches:
            ln.faults = faults.model_copy()
            ln.log_stats = not args.disable_log_stats
        return launches, args.time_scale or 1.0
    cfg = EngineConfig(
        served_model_name=args.served_model_name or args.model,
        model=args.model,
        spec=parse_spec_config(args.speculative_config),
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens,
        profile=args.profile,
        seed=args.seed,
        num_gpu_blocks=args.num_gpu_blocks_override,
        spec_cost_scale=args.spec_cost_scale,
        device_scale=args.device_scale,
        **_reasoning(args),
    )
    return [
        EngineLaunch(
            cfg,
            host=args.host,
            port=args.port,
            device=args.device,
            log_stats=not args.disable_log_stats,
            per_request_metrics=args.per_request_spec_decode_metrics == "summary",
            faults=faults,
        )
    ], args.time_scale or 1.0


async def _serve(launches: list[EngineLaunch], time_scale: float) -> None:
    group = await start_group(launches, time_scale=time_scale)
    for e in group.engines:
        spec = e.handle.engine.spec
        kind = f"speculative {spec.as_dict()}" if spec else "plain"
        print(
            f"emulated vLLM '{e.handle.name}' ({kind}, profile {e.handle.engine.profile.name}, "
            f"device {e.launch.device}) on {e.url}",
            flush=True,
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await group.stop()


def main(args: argparse.Namespace) -> int:
    if (
        args.max_num_seqs < 1
        or args.max_model_len < 16
        or (args.time_scale is not None and args.time_scale <= 0)
    ):
        print(
            "error: --max-num-seqs >= 1, --max-model-len >= 16 and --time-scale > 0 are required",
            file=sys.stderr,
        )
        return 2
    try:
        launches, time_scale = build_launches(args)
    except (SpecConfigError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    try:
        asyncio.run(_serve(launches, time_scale))
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    return 0
