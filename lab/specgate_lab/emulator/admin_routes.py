"""The emulated server's non-OpenAI routes: health, version, ``/metrics`` and the admin API.

``GET /health`` and ``/ping``, ``GET /version``, ``GET /metrics`` (Prometheus text,
subject to the metrics faults), ``GET|POST /_emulator/faults`` (read / change fault
knobs, JSON) and ``GET /_emulator/state``.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError

from specgate_lab.emulator.emulated import ENGINE, json_response
from specgate_lab.emulator.errors import error_body

VLLM_VERSION = "0.20.2"


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def version(request: web.Request) -> web.Response:
    return json_response({"version": VLLM_VERSION})


async def metrics(request: web.Request) -> web.StreamResponse:
    h = request.app[ENGINE]
    f = h.faults
    if f.metrics_delay_s:
        await asyncio.sleep(f.metrics_delay_s)
    if f.garbage_metrics:
        return web.Response(text="<html>definitely { not prometheus\nvllm:broken{{ = NaN NaN\n", status=200)
    h.driver.poll()
    return web.Response(body=h.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def get_faults(request: web.Request) -> web.Response:
    return json_response(request.app[ENGINE].faults.model_dump())


async def post_faults(request: web.Request) -> web.Response:
    h = request.app[ENGINE]
    try:
        update = await request.json()
        if not isinstance(update, dict):
            raise ValueError("body must be a JSON object")
        h.set_faults(update)
    except (ValueError, ValidationError) as e:
        return json_response(error_body(str(e), "BadRequestError", 400), 400)
    return json_response(h.faults.model_dump())


async def state(request: web.Request) -> web.Response:
    h = request.app[ENGINE]
    h.driver.poll()
    e = h.engine
    s = e.stats
    return json_response(
        {
            "model": e.config.served_model_name,
            "speculative_config": e.spec.as_dict() if e.spec else None,
            "profile": e.profile.name,
            "device": h.driver.device.name,
            "emulated_time_s": h.driver.now(),
            "time_scale": h.driver.clock.time_scale,
            "delivery_lag_s": h.driver.lag_s,
            "running": e.num_running,
            "waiting": e.num_waiting,
            "kv_cache_usage": e.kv_usage(),
            "steps": s.steps,
            "busy_s": s.busy_s,
            "prompt_tokens": s.prompt_tokens,
            "generation_tokens": s.generation_tokens,
            "num_drafts": s.num_drafts,
            "num_draft_tokens": s.num_draft_tokens,
            "num_accepted_tokens": s.num_accepted,
            "accepted_per_pos": s.accepted_per_pos,
            "finished": s.finished,
            "dead": h.dead,
        }
    )
