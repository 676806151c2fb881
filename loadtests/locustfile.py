"""Locust kit for specgate (or any OpenAI-compatible chat endpoint, vLLM included).

Users send streaming ``/v1/chat/completions`` requests drawn from specgate's prompt corpus
(``specgate_lab.workload``: copy-heavy code edits, summaries/extraction/quoting over pasted
documents, RAG questions, open chat) at a configurable temperature distribution.
Arrivals are open-loop: one Poisson stream follows the ``--qps`` schedule and each idle
user of a pool takes the next arrival, so the offered load holds whatever the latency as
long as the pool can hold the requests in flight. ``--pool auto`` (the default) sizes it
from the schedule's peak QPS and the answers' latency
(``specgate_lab.workload.schedule.pool_size``) and grows it as the run goes; the run warns
when requests still leave late.

Locust rows (request type / name):
  ``POST <kind>``   the whole request (e2e, ms); its size columns are output tokens.
                    Only these are requests: Locust's ``Aggregated`` row counts them alone.
  ``TTFT <kind>``   time to the first output delta (content, reasoning or tool call), ms
  ``TPOT <kind>``   time per output token after the first, one value per request, ms
  ``ITL <kind>``    inter-token latency: every gap between two output deltas, ms
The last three are measurements shown beside the requests, not requests. Output tokens a
second are in the summary line printed at the end (and per request in the requests CSV),
not in a Locust row, whose columns are times.

Trace replay: ``--trace requests.jsonl`` sends each line's ``body`` at its ``t`` (seconds since
the start) instead of drawing from the corpus.

One worker process (one CPU core) drives about the rate stated in loadtests/README.md; for
more, run Locust distributed (``--processes N``).

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
import locust  # noqa: F401  (first: it monkey-patches the standard library)
from gevent.queue import Queue
from geventhttpclient import HTTPClient
from geventhttpclient.url import URL
from locust import LoadTestShape, User, events, task
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from gateway.wire.sse import ChatStream
from specgate_lab.bench.stats import CSV_FIELDS, RequestRecord, summarize
from specgate_lab.workload import TemperatureDist, parse_mix, sample, to_openai_body
from specgate_lab.workload.schedule import PoissonPacer, Schedule, grown_pool, parse_schedule, pool_size

ROUTE_HEADER = "x-specgate-route"
REASON_HEADER = "x-specgate-reason"

_T0: float | None = None  # wall-clock start of the test on this process
_RECORDS: list[RequestRecord] = []
_USER_IDS = itertools.count()
# arrivals that are due: (s since the start, the trace's request or None); idle users take them
_DUE: Queue[tuple[float, dict[str, Any] | None]] = Queue()
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
    opt(
        "--trace",
        "",
        "replay a JSONL trace instead of the corpus: one request a line, "
        '{"t": seconds since the start, "body": {OpenAI chat body}, "kind": optional label}; '
        "--qps is then the trace's own timing",
    )
    opt("--trace-workers", "1", "distributed replay: worker i of N sends the lines whose index modulo N is i")


def _opts(env: Environment) -> Any:
    return env.parsed_options


_TRACES: dict[str, list[tuple[float, dict[str, Any]]]] = {}


def load_trace(path: str) -> list[tuple[float, dict[str, Any]]]:
    """A JSONL trace's requests as (arrival s, entry), sorted by arrival; ValueError names the
    first bad line."""
    out: list[tuple[float, dict[str, Any]]] = []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                t = float(entry["t"])
                if not isinstance(entry.get("body"), dict) or not math.isfinite(t) or t < 0:
                    raise ValueError
            except (ValueError, KeyError, TypeError):
                raise ValueError(f'{path}:{n}: want {{"t": seconds >= 0, "body": {{...}}}}') from None
            out.append((t, entry))
    if not out:
        raise ValueError(f"{path}: no requests")
    out.sort(key=lambda te: te[0])
    return out


def _trace(env: Environment) -> list[tuple[float, dict[str, Any]]] | None:
    path = str(_opts(env).trace or "")
    if not path:
        return None
    if path not in _TRACES:
        _TRACES[path] = load_trace(path)
    return _TRACES[path]


def trace_schedule(trace: list[tuple[float, dict[str, Any]]]) -> Schedule:
    """The schedule a trace implies, for the pool's size: its busiest second's rate. Open
    ended: the replay ends the run once every request is answered (a distributed run ends at
    ``-t``)."""
    times = [t for t, _ in trace]
    peak, lo = 1, 0
    for hi, t in enumerate(times):
        while t - times[lo] >= 1.0:
            lo += 1
        peak = max(peak, hi - lo + 1)
    return parse_schedule(str(peak))


def _schedule(env: Environment) -> Schedule:
    trace = _trace(env)
    if trace is not None:
        return trace_schedule(trace)
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


def _replay(env: Environment, t0: float, due: Queue[tuple[float, dict[str, Any] | None]]) -> None:
    """This process's share of a trace, each request put into ``due`` at its time."""
    runner = env.runner
    worker = runner.worker_index if isinstance(runner, WorkerRunner) else 0
    every = max(1, int(_opts(env).trace_workers))
    sent = 0
    for i, (t, entry) in enumerate(_trace(env) or ()):
        if i % every != worker % every:
            continue
        gevent.sleep(max(0.0, t0 + t - time.time()))
        due.put((t, entry))
        sent += 1
    if isinstance(runner, WorkerRunner):
        return  # distributed: -t/--run-time ends the run
    while len(_RECORDS) < sent:  # every request of the trace answered (or failed): done
        gevent.sleep(0.05)
    runner.quit()


def _clock(env: Environment, t0: float, due: Queue[tuple[float, dict[str, Any] | None]]) -> None:
    """This process's arrivals: one Poisson stream at the schedule's rate (a worker's share
    of it in a distributed run), each put into ``due`` at its time. The first idle user
    takes it, so requests leave late only when every user of the pool is busy."""
    if _trace(env) is not None:
        _replay(env, t0, due)
        return
    runner = env.runner
    worker = runner.worker_index if isinstance(runner, WorkerRunner) else 0
    arrivals = PoissonPacer(_schedule(env), 1, random.Random(f"{_opts(env).seed}:{worker}:arrivals"))
    while True:
        if isinstance(runner, WorkerRunner):
            # one worker's share of the stream: 1 / the workers the master counts (sent with
            # each spawn message). Not this worker's users over the pool: while the master
            # ramps the pool up, a worker's users are a fraction of their final count, and
            # a share taken from them offered a fraction of the rate for the ramp's length.
            workers = int(getattr(_opts(env), "specgate_workers", 0) or 0)
            if workers > 0:
                arrivals.pool = float(workers)
            elif runner.target_user_count > 0:
                arrivals.pool = max(1.0, _pool(env) / runner.target_user_count)
        t = arrivals.advance(time.time() - t0)
        if t is None:
            return  # schedule over: the shape stops the run
        gevent.sleep(max(0.0, t0 + t - time.time()))
        due.put((t, None))


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
    """One slot of the user pool: takes the next arrival of the ``--qps`` schedule (or of the
    trace), sends a request from the corpus (or the trace's) then, and waits for its answer.

    Not Locust's ``FastHttpUser``: for a streamed answer its request event times the headers
    only, and its streaming reads wait for 1 KB, which merges SSE events and would distort
    TTFT and inter-token latency. The user drives FastHttpUser's client, geventhttpclient,
    itself: one keep-alive connection per user, SSE lines read as they arrive."""

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
        # -H may list several gateway replicas (comma-separated): each user keeps one of them
        hosts = [h.strip() for h in str(self.host).split(",") if h.strip()]
        url = URL(hosts[(uid + worker) % len(hosts)].rstrip("/") + "/v1/chat/completions")
        self.path = url.request_uri
        self.client = HTTPClient.from_url(
            url, concurrency=1, connection_timeout=10.0, network_timeout=self.timeout, block_size=65536
        )
        self.closed_loop = self.schedule.peak_qps == 0
        self.arrival: float | None = None  # when the next request is due, s since the start
        self.entry: dict[str, Any] | None = None  # the trace's request for it, if replaying

    def on_stop(self) -> None:
        self.client.close()

    # Locust calls wait_time() between tasks; on_start also waits before the first one.
    def wait_time(self) -> float:
        if self.closed_loop:
            return 0.0
        self.arrival, self.entry = _DUE.get()  # the next arrival that is due (blocks while none is)
        return 0.0

    def on_start(self) -> None:
        if not self.closed_loop:
            self.wait()

    def _request(self) -> tuple[dict[str, Any], str, str, float]:
        """The body to send, its kind and subkind labels, and its temperature."""
        entry = self.entry
        if entry is not None:
            body = dict(entry["body"])
            body["stream"] = self.stream
            if self.stream:
                body["stream_options"] = {"include_usage": True}
            else:
                body.pop("stream_options", None)
            t = body.get("temperature", 1.0)
            temp = float(t) if isinstance(t, int | float) else 1.0
            return body, str(entry.get("kind") or "trace"), "", temp
        req = sample(
            self.rng, self.mix, self.temps, max_tokens_cap=int(_opts(self.environment).max_tokens_cap)
        )
        return to_openai_body(req, self.model, stream=self.stream), req.kind, req.subkind, req.temperature

    @task
    def chat(self) -> None:
        body, kind, subkind, temperature = self._request()
        now = time.time()
        t0 = _T0 if _T0 is not None else now
        scheduled = t0 + self.arrival if self.arrival is not None else now
        stage = self.schedule.stage_index(scheduled - t0) or 0
        rec = RequestRecord(
            start=now,
            kind=kind,
            subkind=subkind,
            temperature=temperature,
            ok=False,
            lateness=max(0.0, now - scheduled) if not self.closed_loop else 0.0,
            stage=stage,
        )
        exc: BaseException | None = None
        gaps: list[float] = []
        start = time.perf_counter()
        try:
            resp = self.client.request("POST", self.path, body=json.dumps(body), headers=self.headers)
            try:
                rec.status = resp.status_code
                rec.route = resp.get(ROUTE_HEADER) or ""
                rec.reason = resp.get(REASON_HEADER) or ""
                if resp.status_code != 200:
                    raise RuntimeError(f"HTTP {resp.status_code}: {resp.read(300).decode(errors='replace')}")
                if self.stream:
                    gaps = self._read_stream(resp, rec, start)
                else:
                    data = json.loads(resp.read())
                    rec.output_tokens = int((data.get("usage") or {}).get("completion_tokens") or 0)
                    rec.chunks = 1
            finally:
                resp.release()
            rec.e2e = time.perf_counter() - start
            rec.ok = True
        except Exception as e:  # every failure is a Locust failure, never a crash of the user
            exc = e
            rec.error = f"{type(e).__name__}: {e}"[:300]
            rec.e2e = time.perf_counter() - start
        _RECORDS.append(rec)
        self._report(rec, exc, gaps)

    def _read_stream(self, resp: Any, rec: RequestRecord, start: float) -> list[float]:
        """Read the SSE answer line by line as it comes; the gaps between output deltas (s)."""
        stream = ChatStream()
        gaps: list[float] = []
        last: float | None = None
        while not stream.done:
            line = resp.readline(b"\n")
            if not line:
                break
            if stream.feed(line):
                now = time.perf_counter()
                if last is None:
                    rec.ttft = now - start
                else:
                    gaps.append(now - last)
                last = now
        stream.finish()
        rec.chunks = stream.output_chunks
        rec.output_tokens = stream.output_tokens
        return gaps

    def _report(self, rec: RequestRecord, exc: BaseException | None, gaps: list[float]) -> None:
        # The request goes through Locust's request event: its row, Aggregated, failures.
        # Its response length is its output tokens (Locust's "size" columns).
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
        # the request count stay the requests'. All in ms: Locust's columns are times.
        stats = self.environment.stats
        if rec.ttft is not None and self.stream:
            stats.get(rec.kind, "TTFT").log(rec.ttft * 1000, 0)
        if rec.tpot is not None and self.stream:
            stats.get(rec.kind, "TPOT").log(rec.tpot * 1000, 0)
        if gaps:
            itl = stats.get(rec.kind, "ITL")
            for g in gaps:
                itl.log(g * 1000, 0)


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
        if isinstance(self.runner, MasterRunner):  # the workers split the arrivals by this count
            o.specgate_workers = self.runner.worker_count
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
