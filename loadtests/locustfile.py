"""Locust kit for specgate (or any OpenAI-compatible chat endpoint, vLLM included).

Users send streaming ``/v1/chat/completions`` requests drawn from specgate's prompt corpus
(``gateway.workload``: copy-heavy code edits, summaries/extraction/quoting over pasted
documents, RAG questions, open chat) at a configurable temperature distribution.
Arrivals are open-loop: one Poisson stream follows the ``--qps`` schedule and each idle
user of a pool takes the next arrival, so the offered load holds whatever the latency as
long as the pool can hold the requests in flight. ``--pool auto`` (the default) sizes it
from the schedule's peak QPS and the answers' latency
(``gateway.workload.schedule.pool_size``) and grows it as the run goes; the run warns
when requests still leave late.

Locust rows (request type / name):
  ``POST <kind>``   the whole request (e2e, ms); response length = output tokens.
                    Only these are requests: Locust's ``Aggregated`` row counts them alone.
  ``TTFT <kind>``   time to the first content delta, ms
  ``TPOT <kind>``   time per output token after the first, ms
  ``OTPS <kind>``   output tokens/s of one request (the "ms" columns hold tokens/s)
The last three are per-request measurements shown beside the requests, not requests.

A short headless run, then one writing CSVs (``--csv`` is Locust's own;
``--specgate-requests-csv`` adds one row per request with route, TTFT, TPOT, tokens):

    locust -f loadtests/locustfile.py --headless -H http://127.0.0.1:8000 -t 20s --qps 2

    locust -f loadtests/locustfile.py --headless -H http://127.0.0.1:8000 \\
        --qps "1:30,2:30,4:30" --mix "edit=0.4,summary=0.2,rag=0.1,chat=0.3" \\
        --temperature "uniform:0:1" --model qwen3-8b --csv out/run \\
        --specgate-requests-csv out/requests.csv

Every option has an environment variable (``SPECGATE_LT_<NAME>``). Locust's own ``--help``
exits before it imports a locustfile, so it cannot list them: ``python
loadtests/locustfile.py --help`` prints Locust's help with the specgate options.
``--qps 0`` switches to closed-loop: ``-u`` users, each sending back to back.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import random
import sys
import time
from typing import Any

import gevent
import locust  # noqa: F401  (first: it monkey-patches the standard library before requests loads ssl)
import requests
from gevent.queue import Queue
from locust import LoadTestShape, User, events, task
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from gateway.bench.stats import CSV_FIELDS, RequestRecord, summarize
from gateway.wire.sse import ChatStream
from gateway.workload import TemperatureDist, parse_mix, sample, to_openai_body
from gateway.workload.schedule import PoissonPacer, Schedule, grown_pool, parse_schedule, pool_size

ROUTE_HEADER = "x-specgate-route"
REASON_HEADER = "x-specgate-reason"

_T0: float | None = None  # wall-clock start of the test on this process
_RECORDS: list[RequestRecord] = []
_USER_IDS = itertools.count()
_DUE: Queue[float] = Queue()  # arrivals that are due (s since the start); idle users take them
_CLOCK: gevent.Greenlet | None = None  # puts this process's arrivals into _DUE on time


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    g = parser.add_argument_group(
        "specgate",
        "OpenAI chat load from specgate's prompt corpus. Every option can also be set with "
        "the environment variable named after it (SPECGATE_LT_<NAME>, shown with each).",
    )

    def opt(name: str, default: str, help_text: str, **kw: Any) -> None:
        env = "SPECGATE_LT_" + name.lstrip("-").replace("specgate-", "").replace("-", "_").upper()
        g.add_argument(name, default=default, env_var=env, help=f"{help_text} (env {env})", **kw)

    opt(
        "--qps",
        "2",
        "target-QPS schedule: 4 | 1:30,2:30,4:60 | ramp:0.5-8:120 | steps:1-16:5x20; 0 = closed loop",
    )
    opt(
        "--pool",
        "auto",
        "users kept alive to carry the arrivals (the most requests in flight): a number, or "
        "auto: 2 x peak QPS x latency + 8, latency taken as 10 s until answers are timed, "
        "then their p95; grown while the run goes, never shrunk",
    )
    opt(
        "--mix",
        "default",
        "kind weights: edit=0.4,summary=0.2,rag=0.1,chat=0.3 (or sub-kinds: rename, quote…)",
    )
    opt(
        "--temperature",
        "default",
        "temperature distribution: 0.7 | uniform:0:1 | choice:0,1 | mix:0=0.5,1=0.5",
    )
    opt("--model", "qwen3-8b", "model name sent in the body")
    opt("--seed", "1", "corpus seed (each user derives its own stream from it)")
    opt("--max-tokens-cap", "1024", "upper bound on max_tokens of any request")
    opt("--stream", "true", "true: streaming with usage chunk; false: plain JSON responses")
    opt("--api-key", "", "bearer token, if the endpoint needs one")
    opt("--route", "", "x-specgate-route header to send: auto | spec | base (empty: none)")
    opt("--request-timeout", "300", "seconds before a request is abandoned")
    opt("--specgate-requests-csv", "", "write one row per request to this CSV at the end")


def _opts(env: Environment) -> Any:
    return env.parsed_options


def _schedule(env: Environment) -> Schedule:
    return parse_schedule(str(_opts(env).qps))


def _auto_pool(env: Environment) -> bool:
    return str(_opts(env).pool).strip().lower() == "auto"


def _pool(env: Environment) -> int:
    """The pool now: ``--pool N``, or the auto size (kept in the options by the shape, so
    that distributed workers get it with each spawn message)."""
    o = _opts(env)
    if not _auto_pool(env):
        return max(1, int(o.pool))
    return int(getattr(o, "specgate_pool_size", 0)) or pool_size(_schedule(env).peak_qps)


def _clock(env: Environment, t0: float, due: Queue[float]) -> None:
    """This process's arrivals: one Poisson stream at the schedule's rate (a worker's share
    of it in a distributed run), each put into ``due`` at its time. The first idle user
    takes it, so requests leave late only when every user of the pool is busy."""
    runner = env.runner
    worker = runner.worker_index if isinstance(runner, WorkerRunner) else 0
    arrivals = PoissonPacer(_schedule(env), 1, random.Random(f"{_opts(env).seed}:{worker}:arrivals"))
    while True:
        if isinstance(runner, WorkerRunner) and runner.target_user_count > 0:
            # this worker's users are target_user_count of the whole pool
            arrivals.pool = max(1.0, _pool(env) / runner.target_user_count)
        t = arrivals.advance(time.time() - t0)
        if t is None:
            return  # schedule over: the shape stops the run
        gevent.sleep(max(0.0, t0 + t - time.time()))
        due.put(t)


def _latency_s(env: Environment) -> float | None:
    """p95 of the requests' e2e so far, and of the last ~10 s when that is larger; None
    before the first answer (the Aggregated row counts requests only)."""
    total = env.stats.total
    if total.num_requests == 0:
        return None
    ms = float(total.get_response_time_percentile(0.95) or 0)
    if total.use_response_times_cache:
        ms = max(ms, float(total.get_current_response_time_percentile(0.95) or 0))
    return ms / 1000


@events.test_start.add_listener
def _on_start(environment: Environment, **_: Any) -> None:
    global _T0, _DUE, _CLOCK
    _T0 = time.time()
    _RECORDS.clear()
    o = _opts(environment)
    # Fail fast on bad options, on every process.
    parse_mix(o.mix)
    TemperatureDist.parse(o.temperature)
    _pool(environment)
    if _schedule(environment).peak_qps > 0 and not isinstance(environment.runner, MasterRunner):
        _DUE = Queue()
        _CLOCK = gevent.spawn(_clock, environment, _T0, _DUE)


@events.test_stop.add_listener
def _on_stop(environment: Environment, **_: Any) -> None:
    if _CLOCK is not None:
        _CLOCK.kill(block=False)
    if not _RECORDS or _T0 is None:
        return
    o = _opts(environment)
    dur = max(1e-9, time.time() - _T0)
    s = summarize(_RECORDS, dur)

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v * 1000:.1f}"

    print(
        f"[specgate] {s['requests']} requests, {s['failures']} failed, {s['achieved_qps']:.2f} req/s, "
        f"TTFT p50/p99 {ms(s['ttft_p50_s'])}/{ms(s['ttft_p99_s'])} ms, "
        f"TPOT p50/p99 {ms(s['tpot_p50_s'])}/{ms(s['tpot_p99_s'])} ms, "
        f"{s['output_tokens_per_s']:.1f} output tok/s, routes {s['route_share']}",
        file=sys.stderr,
    )
    late = s["lateness_p99_s"] or 0.0
    if late > 0.5:
        print(
            f"[specgate] warning: p99 of requests left {late:.2f}s late with a pool of "
            f"{_pool(environment)}; raise --pool to hold the QPS",
            file=sys.stderr,
        )
    path = str(o.specgate_requests_csv)
    if path:
        runner = environment.runner
        if isinstance(runner, WorkerRunner):  # distributed: one file per worker
            root, ext = os.path.splitext(path)
            path = f"{root}.worker{runner.worker_index}{ext or '.csv'}"
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
            w.writeheader()
            for r in _RECORDS:
                w.writerow(r.row())


class ChatUser(User):
    """One slot of the user pool: takes the next arrival of the ``--qps`` schedule, sends a
    request from the corpus then, and waits for its answer."""

    abstract = False

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)
        o = _opts(environment)
        uid = next(_USER_IDS)
        worker = environment.runner.worker_index if isinstance(environment.runner, WorkerRunner) else 0
        self.rng = random.Random(f"{o.seed}:{worker}:{uid}")
        self.mix = parse_mix(o.mix)
        self.temps = TemperatureDist.parse(o.temperature)
        self.schedule = _schedule(environment)
        self.stream = str(o.stream).lower() in ("1", "true", "yes", "on")
        self.timeout = float(o.request_timeout)
        self.model = str(o.model)
        self.headers = {"content-type": "application/json"}
        if o.api_key:
            self.headers["authorization"] = f"Bearer {o.api_key}"
        if o.route:
            self.headers[ROUTE_HEADER] = str(o.route)
        self.session = requests.Session()
        self.closed_loop = self.schedule.peak_qps == 0
        self.arrival: float | None = None  # when the next request is due, s since the start

    def on_stop(self) -> None:
        self.session.close()

    # Locust calls wait_time() between tasks; on_start also waits before the first one.
    def wait_time(self) -> float:
        if self.closed_loop:
            return 0.0
        self.arrival = _DUE.get()  # the next arrival that is due (blocks while none is)
        return 0.0

    def on_start(self) -> None:
        if not self.closed_loop:
            self.wait()

    @task
    def chat(self) -> None:
        req = sample(
            self.rng, self.mix, self.temps, max_tokens_cap=int(_opts(self.environment).max_tokens_cap)
        )
        body = to_openai_body(req, self.model, stream=self.stream)
        now = time.time()
        t0 = _T0 if _T0 is not None else now
        scheduled = t0 + self.arrival if self.arrival is not None else now
        stage = self.schedule.stage_index(scheduled - t0) or 0
        rec = RequestRecord(
            start=now,
            kind=req.kind,
            subkind=req.subkind,
            temperature=req.temperature,
            ok=False,
            lateness=max(0.0, now - scheduled) if not self.closed_loop else 0.0,
            stage=stage,
        )
        url = self.host.rstrip("/") + "/v1/chat/completions"
        exc: BaseException | None = None
        start = time.perf_counter()
        try:
            with self.session.post(
                url,
                data=json.dumps(body),
                headers=self.headers,
                stream=self.stream,
                timeout=(10, self.timeout),
            ) as resp:
                rec.status = resp.status_code
                rec.route = resp.headers.get(ROUTE_HEADER, "")
                rec.reason = resp.headers.get(REASON_HEADER, "")
                if resp.status_code != 200:
                    raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:300]}")
                if self.stream:
                    self._read_stream(resp, rec, start)
                else:
                    data = resp.json()
                    rec.output_tokens = int((data.get("usage") or {}).get("completion_tokens") or 0)
                    rec.chunks = 1
            rec.e2e = time.perf_counter() - start
            rec.ok = True
        except Exception as e:  # every failure is a Locust failure, never a crash of the user
            exc = e
            rec.error = f"{type(e).__name__}: {e}"[:300]
            rec.e2e = time.perf_counter() - start
        _RECORDS.append(rec)
        self._report(rec, exc)

    def _read_stream(self, resp: requests.Response, rec: RequestRecord, start: float) -> None:
        stream = ChatStream()
        for data in resp.iter_content(chunk_size=512):
            if stream.feed(data) and rec.ttft is None:
                rec.ttft = time.perf_counter() - start
            if stream.done:
                break
        stream.finish()
        rec.chunks = stream.content_chunks
        rec.output_tokens = stream.output_tokens

    def _report(self, rec: RequestRecord, exc: BaseException | None) -> None:
        # The request goes through Locust's request event: its row, Aggregated, failures.
        self.environment.events.request.fire(
            request_type="POST",
            name=rec.kind,
            response_time=(rec.e2e or 0.0) * 1000,
            response_length=rec.output_tokens,
            exception=exc,
            context={"subkind": rec.subkind, "route": rec.route},
        )
        if exc is not None:
            return
        # Per-request measurements get rows of their own, written straight into the stats
        # (locally and, through the worker reports, on the master) so that Aggregated and
        # the request count stay the requests'.
        stats = self.environment.stats
        if rec.ttft is not None and self.stream:
            stats.get(rec.kind, "TTFT").log(rec.ttft * 1000, 0)
        if rec.tpot is not None and self.stream:
            stats.get(rec.kind, "TPOT").log(rec.tpot * 1000, 0)
        if rec.tokens_per_s is not None:
            stats.get(rec.kind, "OTPS").log(rec.tokens_per_s, 0)


class QpsShape(LoadTestShape):
    """Keeps the user pool alive for the length of the ``--qps`` schedule.

    The offered load is set by the users' Poisson pacing, not by the user count; the pool
    only bounds the requests in flight. With ``--pool auto`` each tick grows it to what the
    peak QPS needs at the latency seen so far. ``--qps 0`` (closed loop) uses
    ``-u``/``-r``/``-t``. An open-ended schedule (``--qps 4``) runs until ``-t``/``--run-time``.
    """

    use_common_options = True

    def tick(self) -> tuple[int, float] | None:
        env = self.runner.environment if self.runner is not None else None
        if env is None:
            return None
        o = env.parsed_options
        t = self.get_run_time()
        run_time = getattr(o, "run_time", None)
        if run_time and t >= run_time:
            return None
        sched = _schedule(env)
        if sched.peak_qps == 0:
            return int(o.num_users or 1), float(o.spawn_rate or 1)
        if math.isfinite(sched.duration_s) and t >= sched.duration_s:
            return None
        pool = _pool(env)
        if _auto_pool(env):
            pool = grown_pool(pool, sched.peak_qps, _latency_s(env))
            o.specgate_pool_size = pool
        # At most 100 users/s (Locust warns above that) unless the QPS needs them faster.
        return pool, float(min(pool, max(100.0, 2 * sched.peak_qps)))


if __name__ == "__main__":
    # ``python loadtests/locustfile.py --help``: Locust's help with this file's options
    # (``locust -f ... --help`` prints it before importing the file, without them).
    from locust.argument_parser import get_parser

    get_parser().print_help()
