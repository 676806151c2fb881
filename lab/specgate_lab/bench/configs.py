"""The gateway configurations the benchmarks write: one emulated pair, or several of one
model (``specgate bench --pairs N``), each pair on its own emulated device."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def emulated_pair_model(
    spec_url: str,
    base_url: str,
    *,
    spec_served: str = "qwen3-8b-spec",
    base_served: str = "qwen3-8b-base",
    name: str = "m1",
    device: str | None = None,
    spec_extra: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """The gateway config entry of model ``name`` on one emulated pair: ``spec0`` (ngram,
    k=5) at ``spec_url`` and ``base0`` at ``base_url``; ``spec_extra`` adds keys to the
    spec engine's entry, ``extra`` model keys (``timeouts``, ``retry``, ``routing``, ...)."""
    pair: dict[str, Any] = {} if device is None else {"device": device}
    pair["spec"] = {
        "name": "spec0",
        "url": spec_url,
        "served_model_name": spec_served,
        "method": "ngram",
        "k": 5,
        **(spec_extra or {}),
    }
    pair["base"] = {"name": "base0", "url": base_url, "served_model_name": base_served}
    return {"name": name, "pairs": [pair], **extra}


def gateway_config(
    port: int,
    spec_port: int,
    base_port: int,
    policy: str,
    *,
    epp_port: int | None = None,
    more: Sequence[tuple[int, int]] = (),
) -> dict[str, Any]:
    """The benchmark gateway's config: one emulated pair (n-gram 2..5, as ``emulate --pair``
    declares it), generous upstream timeouts, fast scrapes, routing ``policy``; with
    ``epp_port``, also the Endpoint Picker for Envoy on 127.0.0.1:``epp_port``. ``more``:
    the (spec, base) ports of further pairs of the same model, each on its own device
    (pair ``i``: ``spec<i>`` / ``base<i>`` on ``gpu<i>``)."""
    cfg: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": port, "max_concurrency": 4096},
        "scrape": {"enabled": True, "interval_s": 0.5, "timeout_s": 1.0, "stale_after_s": 5.0},
        "models": [
            emulated_pair_model(
                f"http://127.0.0.1:{spec_port}",
                f"http://127.0.0.1:{base_port}",
                name="qwen3-8b",
                device="gpu0",
                spec_extra={"prompt_lookup_min": 2, "prompt_lookup_max": 5},
                timeouts={"connect_s": 5.0, "first_byte_s": 900.0, "idle_s": 300.0, "total_s": 3600.0},
                routing={"policy": policy},
            )
        ],
    }
    for i, (sp, bp) in enumerate(more, start=1):
        cfg["models"][0]["pairs"].append(extra_pair(i, sp, bp))
    if epp_port is not None:
        cfg["epp"] = {"enabled": True, "host": "127.0.0.1", "port": epp_port}
    return cfg


def extra_pair(i: int, spec_port: int, base_port: int) -> dict[str, Any]:
    """Pair ``i`` (> 0) of the benchmark's model, its engines as pair 0's (``gateway_config``)."""
    (pair,) = emulated_pair_model(
        f"http://127.0.0.1:{spec_port}",
        f"http://127.0.0.1:{base_port}",
        device=f"gpu{i}",
        spec_extra={"prompt_lookup_min": 2, "prompt_lookup_max": 5},
    )["pairs"]
    pair["spec"]["name"], pair["base"]["name"] = f"spec{i}", f"base{i}"
    return dict(pair)
