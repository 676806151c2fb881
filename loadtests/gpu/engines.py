"""The engine set of the real-GPU run: one plain engine and several speculative ones, all
serving the same random-weight Qwen3-8B on ONE GPU, each in its own process session.

Only the pair under test gets traffic; the other engines sit idle (an idle vLLM engine
does no GPU work), so every (spec, base) pair behaves like a pair alone on the GPU while
the whole set starts once. Memory is split with ``--kv-cache-memory-bytes`` instead of
``--gpu-memory-utilization``, so that engines starting at the same time do not mistake
each other's allocations for their own (vLLM's memory profiling reads device-wide usage).

On the device machine (see run_device.sh)::

    python3 loadtests/gpu/engines.py start  --models /tmp/vmodels --logs /tmp/vlogs
    python3 loadtests/gpu/engines.py wait   --logs /tmp/vlogs --timeout 420
    python3 loadtests/gpu/engines.py status --logs /tmp/vlogs
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

GIB = 1 << 30
PAIR_KV_GIB = 6.0  # a pair engine's KV cache, unless --kv-gib says otherwise
MODEL = "qwen3-8b"  # the model name clients use at the gateway


@dataclass(frozen=True)
class Engine:
    name: str  # short name: base, ngram, eagle3-hi, ...
    port: int
    kv_gib: float
    spec: dict[str, Any] | None = None  # --speculative-config; None = the plain engine
    draft: str | None = None  # draft model folder name under --models (draft_model / eagle3)
    notes: str = ""
    extra: tuple[str, ...] = field(default=())
    env: tuple[tuple[str, str], ...] = field(default=())  # extra environment of its process

    @property
    def served(self) -> str:
        return f"{MODEL}-{self.name}"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def method(self) -> str | None:
        return None if self.spec is None else str(self.spec["method"])

    @property
    def k(self) -> int:
        return 0 if self.spec is None else int(self.spec["num_speculative_tokens"])

    def spec_config(self, models: str) -> dict[str, Any] | None:
        if self.spec is None:
            return None
        cfg = dict(self.spec)
        if self.draft:
            cfg["model"] = os.path.join(models, self.draft)
        return cfg

    def synthetic_al(self) -> float | None:
        """Mean acceptance length the synthetic rates give: 1 + sum of unconditional rates."""
        if self.spec is None or "synthetic_acceptance_rates" not in self.spec:
            return None
        return 1.0 + sum(self.spec["synthetic_acceptance_rates"])


def _synthetic(method: str, k: int, rates: list[float]) -> dict[str, Any]:
    assert len(rates) == k
    return {
        "method": method,
        "num_speculative_tokens": k,
        "rejection_sample_method": "synthetic",
        "synthetic_acceptance_rates": rates,
    }


EAGLE3_LO = _synthetic("eagle3", 3, [0.4, 0.15, 0.05])  # AL 1.6
V1_RUNNER = (("VLLM_USE_V2_MODEL_RUNNER", "0"),)  # vLLM's V1 model runner, where V2 is the default

ENGINES: tuple[Engine, ...] = (
    Engine("base", 8100, PAIR_KV_GIB, notes="plain engine"),
    Engine(
        "ngram",
        8101,
        PAIR_KV_GIB,
        {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2, "prompt_lookup_max": 5},
        notes="prompt lookup; acceptance is whatever the random-weight model's output gives",
    ),
    Engine(
        "eagle3-hi",
        8102,
        PAIR_KV_GIB,
        _synthetic("eagle3", 3, [0.8, 0.6, 0.45]),
        draft="qwen3-8b-eagle3",
        notes="EAGLE-3 head (random weights), synthetic acceptance, AL 2.85",
    ),
    Engine(
        "eagle3-lo",
        8103,
        PAIR_KV_GIB,
        EAGLE3_LO,
        draft="qwen3-8b-eagle3",
        notes="EAGLE-3 head (random weights), synthetic acceptance, AL 1.6",
    ),
    Engine(
        "draft-hi",
        8104,
        7.0,
        _synthetic("draft_model", 4, [0.85, 0.7, 0.55, 0.45]),
        draft="qwen3-0.6b",
        notes="Qwen3-0.6B-shaped draft model (random weights), synthetic acceptance, AL 3.55",
    ),
    Engine(
        "eagle3-dsd",
        8105,
        2 * PAIR_KV_GIB,  # the whole budget of a pair: one engine instead of two
        {
            **EAGLE3_LO,
            "num_speculative_tokens_per_batch_size": [[1, 32, 3], [33, 1024, 0]],
        },
        draft="qwen3-8b-eagle3",
        notes="eagle3-lo with Dynamic SD (vLLM >= 0.24): K=3 up to batch 32, no drafts above; "
        "on vLLM 0.26.0 the V2 model runner (its default here) fails to capture CUDA graphs with "
        "K=0, so this engine runs the V1 runner, on which vLLM makes Dynamic SD's graphs piecewise",
        env=V1_RUNNER,
    ),
    Engine(
        "eagle3-lo-v1",
        8107,
        PAIR_KV_GIB,
        EAGLE3_LO,
        draft="qwen3-8b-eagle3",
        notes="eagle3-lo on the V1 model runner: what the runner alone costs, beside eagle3-dsd",
        env=V1_RUNNER,
    ),
    Engine(
        "eagle3-dsd1",
        8106,
        2 * PAIR_KV_GIB,
        {
            **EAGLE3_LO,
            "num_speculative_tokens_per_batch_size": [[1, 32, 3], [33, 1024, 1]],
        },
        draft="qwen3-8b-eagle3",
        notes="eagle3-lo with Dynamic SD on the V2 model runner (full CUDA graphs): K=3 up to "
        "batch 32, K=1 above (K=0 fails its graph capture on vLLM 0.26.0)",
    ),
)

COMMON = (
    "--load-format",
    "dummy",
    "--max-model-len",
    "2048",
    "--gpu-memory-utilization",
    "0.05",  # only checked against free memory at start; --kv-cache-memory-bytes sizes the cache
    "--seed",
    "0",
    "--disable-uvicorn-access-log",
)


def by_name(name: str) -> Engine:
    for e in ENGINES:
        if e.name == name:
            return e
    raise KeyError(f"no engine {name!r}; choose from {', '.join(e.name for e in ENGINES)}")


MAX_NUM_SEQS = 64  # every engine's batch cap in rounds 1-16 (round 17: 256, --max-num-seqs)


def command(
    e: Engine, models: str, max_num_seqs: int = MAX_NUM_SEQS, kv_gib: float | None = None
) -> list[str]:
    """The engine's vLLM command line; ``kv_gib`` overrides its KV-cache budget (a pair's
    engine gets that, an engine that stands for a whole pair twice that)."""
    gib = e.kv_gib if kv_gib is None else kv_gib * e.kv_gib / PAIR_KV_GIB
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        os.path.join(models, MODEL),
        "--served-model-name",
        e.served,
        "--port",
        str(e.port),
        "--kv-cache-memory-bytes",
        str(int(gib * GIB)),
        "--max-num-seqs",
        str(max_num_seqs),
        *COMMON,
        *e.extra,
    ]
    sc = e.spec_config(models)
    if sc is not None:
        cmd += ["--speculative-config", json.dumps(sc, separators=(",", ":"))]
    return cmd


def start(
    models: str, logs: str, names: list[str], max_num_seqs: int = MAX_NUM_SEQS, kv_gib: float | None = None
) -> int:
    os.makedirs(logs, exist_ok=True)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    pids: dict[str, int] = {}
    cmds: dict[str, list[str]] = {}
    known = os.path.join(logs, "pids.json")
    if os.path.exists(known):  # engines started earlier on this machine stay in the set
        with open(known, encoding="utf-8") as fh:
            old = json.load(fh)
        pids, cmds = {**old["pids"]}, {**old["commands"]}
    for name in names:
        e = by_name(name)
        cmd = command(e, models, max_num_seqs, kv_gib)
        with open(os.path.join(logs, f"{e.name}.log"), "ab") as log:
            p = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**env, **dict(e.env)},
                start_new_session=True,
            )
        pids[e.name] = p.pid
        cmds[e.name] = cmd
        print(f"started {e.name} pid {p.pid} on :{e.port}", flush=True)
        time.sleep(2.0)  # spread the CPU-heavy imports a little
    with open(os.path.join(logs, "pids.json"), "w", encoding="utf-8") as fh:
        json.dump({"pids": pids, "commands": cmds}, fh, indent=1)
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie counts as dead
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _tail(path: str, n: int = 3000) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - n))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return ""


def wait(logs: str, timeout: float) -> int:
    """Wait until every started engine answers /health; report the dead ones at once."""
    with open(os.path.join(logs, "pids.json"), encoding="utf-8") as fh:
        pids: dict[str, int] = json.load(fh)["pids"]
    t0 = time.monotonic()
    pending = dict(pids)
    dead: list[str] = []
    while pending and time.monotonic() - t0 < timeout:
        for name, pid in list(pending.items()):
            if _healthy(by_name(name).url):
                print(f"ready {name} after {time.monotonic() - t0:.0f}s", flush=True)
                del pending[name]
            elif not _alive(pid):
                print(f"DIED {name}:\n{_tail(os.path.join(logs, name + '.log'))}", flush=True)
                dead.append(name)
                del pending[name]
        if pending:
            time.sleep(3.0)
    for name in pending:
        print(f"NOT READY {name} after {timeout:.0f}s:\n{_tail(os.path.join(logs, name + '.log'), 1500)}")
    ready = [n for n in pids if n not in dead and n not in pending]
    with open(os.path.join(logs, "ready.json"), "w", encoding="utf-8") as fh:
        json.dump(ready, fh)
    print("ready:", ",".join(ready), flush=True)
    return 0 if ready and "base" in ready else 1


def status(logs: str) -> int:
    with open(os.path.join(logs, "pids.json"), encoding="utf-8") as fh:
        pids: dict[str, int] = json.load(fh)["pids"]
    for name, pid in pids.items():
        print(f"{name}: pid {pid} alive={_alive(pid)} healthy={_healthy(by_name(name).url)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=("start", "wait", "status", "list"))
    p.add_argument("--models", default="/tmp/vmodels")
    p.add_argument("--logs", default="/tmp/vlogs")
    p.add_argument("--engines", default=",".join(e.name for e in ENGINES))
    p.add_argument("--timeout", type=float, default=420.0)
    p.add_argument("--max-num-seqs", type=int, default=MAX_NUM_SEQS, help="every engine's batch cap")
    p.add_argument(
        "--kv-gib",
        type=float,
        default=None,
        help="KV cache of a pair's engine in GiB (default: each engine's own, 6 for a pair's)",
    )
    a = p.parse_args(argv)
    if a.action == "start":
        names = [n for n in a.engines.split(",") if n]
        return start(a.models, a.logs, names, a.max_num_seqs, a.kv_gib)
    if a.action == "wait":
        return wait(a.logs, a.timeout)
    if a.action == "status":
        return status(a.logs)
    for e in ENGINES:
        print(" ".join(command(e, a.models, a.max_num_seqs, a.kv_gib)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
