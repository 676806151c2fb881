"""vLLM's ``/metrics`` for one emulated engine, in its own ``CollectorRegistry``.

Names, types, labels and histogram buckets follow a real vLLM 0.20.2 page (kept in
``tests/fixtures/vllm-0.20.2``): every family carries ``engine="0"`` and
``model_name``; ``vllm:spec_decode_*`` families exist only on speculative engines.
Several engines live in one process, so each has its own registry; with
``log_stats=False`` (vLLM's ``--disable-log-stats``) no ``vllm:*`` family is
registered at all. Timings are observed in emulated seconds.
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    gc_collector,
    generate_latest,
    platform_collector,
    process_collector,
)

from specgate_lab.emulator.engine import FINISH_REASONS, Engine, EngineRequest, StepPlan

LATENCY_BUCKETS: tuple[float, ...] = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0)
LATENCY_BUCKETS += (40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TTFT_BUCKETS: tuple[float, ...] = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
)
TTFT_BUCKETS += (10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS: tuple[float, ...] = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
)
ITL_BUCKETS += (20.0, 40.0, 80.0)
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
N_BUCKETS = (1, 2, 5, 10, 20)

L = ("engine", "model_name")


def buckets_1_2_5(max_value: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 series up to ``max_value`` (e.g. 1, 2, 5, ..., 2000 for 4096)."""
    out: list[float] = []
    mant = (1, 2, 5)
    exp = 0
    while True:
        for m in mant:
            v = m * 10**exp
            if v > max_value:
                return tuple(out)
            out.append(float(v))
        exp += 1


class EngineMetrics:
    """Prometheus families of one engine; also the engine's :class:`EngineObserver`."""

    def __init__(
        self,
        model_name: str,
        *,
        spec_k: int | None,
        max_model_len: int,
        log_stats: bool = True,
        gpu_memory_utilization: float = 0.42,
        num_gpu_blocks: int = 4185,
    ) -> None:
        self.registry = r = CollectorRegistry()
        process_collector.ProcessCollector(registry=r)
        platform_collector.PlatformCollector(registry=r)
        gc_collector.GCCollector(registry=r)
        self.log_stats = log_stats
        self.engine: Engine | None = None
        self._gen_pending = 0
        self._prompt_pending = 0
        if not log_stats:
            return
        lv = ("0", model_name)
        self._lv = lv

        def c(name: str, doc: str) -> Counter:
            return Counter(name, doc, L, registry=r)

        def h(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, L, buckets=buckets, registry=r).labels(*lv)

        self.spec_k = spec_k
        if spec_k:
            self.drafts = c("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.").labels(*lv)
            self.draft_tokens = c("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.").labels(*lv)
            self.accepted = c("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.").labels(
                *lv
            )
            per_pos = Counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                (*L, "position"),
                registry=r,
            )
            self.per_pos = [per_pos.labels(*lv, str(i)) for i in range(spec_k)]
        for name, doc in (
            (
                "vllm:estimated_flops_per_gpu",
                "Estimated number of floating point operations per GPU (for Model Flops Utilization "
                "calculations).",
            ),
            (
                "vllm:estimated_read_bytes_per_gpu",
                "Estimated number of bytes read from memory per GPU (for Model Flops Utilization "
                "calculations).",
            ),
            (
                "vllm:estimated_write_bytes_per_gpu",
                "Estimated number of bytes written to memory per GPU (for Model Flops Utilization "
                "calculations).",
            ),
        ):
            c(name, doc).labels(*lv)
        self.running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", L, registry=r
        ).labels(*lv)
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", L, registry=r
        ).labels(*lv)
        wbr = Gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling "
            "capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked "
            "status). Sum of all reasons equals vllm:num_requests_waiting.",
            (*L, "reason"),
            registry=r,
        )
        self.waiting_capacity = wbr.labels(*lv, "capacity")
        wbr.labels(*lv, "deferred")
        sleep = Gauge(
            "vllm:engine_sleep_state",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; "
            "weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
            (*L, "sleep_state"),
            registry=r,
        )
        sleep.labels(*lv, "awake").set(1)
        sleep.labels(*lv, "weights_offloaded")
        sleep.labels(*lv, "discard_all")
        self.kv = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", L, registry=r
        ).labels(*lv)
        self.prefix_queries = c(
            "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        ).labels(*lv)
        c("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.").labels(*lv)
        c(
            "vllm:external_prefix_cache_queries",
            "External prefix cache queries from KV connector cross-instance cache sharing, in terms of "
            "number of queried tokens.",
        ).labels(*lv)
        c(
            "vllm:external_prefix_cache_hits",
            "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number "
            "of cached tokens.",
        ).labels(*lv)
        c("vllm:mm_cache_queries", "Multi-modal cache queries, in terms of number of queried items.").labels(
            *lv
        )
        c("vllm:mm_cache_hits", "Multi-modal cache hits, in terms of number of cached items.").labels(*lv)
        self.preemptions = c(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        ).labels(*lv)
        self.prompt_tokens = c("vllm:prompt_tokens", "Number of prefill tokens processed.").labels(*lv)
        by_source = Counter(
            "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", (*L, "source"), registry=r
        )
        self.prompt_local = by_source.labels(*lv, "local_compute")
        by_source.labels(*lv, "local_cache_hit")
        by_source.labels(*lv, "external_kv_transfer")
        c("vllm:prompt_tokens_cached", "Number of cached prompt tokens (local + external).").labels(*lv)
        self.generation_tokens = c("vllm:generation_tokens", "Number of generation tokens processed.").labels(
            *lv
        )
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            ("engine", "finished_reason", "model_name"),
            registry=r,
        )
        self.success = {reason: success.labels("0", reason, model_name) for reason in FINISH_REASONS}
        tok_b = buckets_1_2_5(max_model_len)
        self.req_prompt = h("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tok_b)
        self.req_gen = h("vllm:request_generation_tokens", "Number of generation tokens processed.", tok_b)
        self.iteration = h(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            tuple(float(b) for b in ITERATION_BUCKETS),
        )
        self.max_gen = h(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            tok_b,
        )
        self.params_n = h(
            "vllm:request_params_n",
            "Histogram of the n request parameter.",
            tuple(float(b) for b in N_BUCKETS),
        )
        self.params_max_tokens = h(
            "vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", tok_b
        )
        self.ttft = h(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = h(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS
        )
        self.tpot = h(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        )
        self.e2e = h(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            LATENCY_BUCKETS,
        )
        self.queue = h(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            LATENCY_BUCKETS,
        )
        self.inference = h(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            LATENCY_BUCKETS,
        )
        self.prefill = h(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            LATENCY_BUCKETS,
        )
        self.decode = h(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            LATENCY_BUCKETS,
        )
        self.kv_computed = h(
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            tok_b,
        )
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            (
                "block_size",
                "cache_dtype",
                "enable_prefix_caching",
                "engine",
                "gpu_memory_utilization",
                "num_gpu_blocks",
            ),
            registry=r,
        )
        info.labels("16", "auto", "True", "0", str(gpu_memory_utilization), str(num_gpu_blocks)).set(1)

    # --- EngineObserver -------------------------------------------------------------
    def on_step(self, plan: StepPlan, now: float) -> None:
        if self.log_stats:
            self.iteration.observe(plan.num_tokens)

    def on_prompt_tokens(self, n: int) -> None:
        self._prompt_pending += n  # flushed into the counters at scrape time (hot path)

    def on_preempt(self, req: EngineRequest) -> None:
        if self.log_stats:
            self.preemptions.inc()

    def on_first_token(self, req: EngineRequest) -> None:
        if self.log_stats and req.first_token_at is not None:
            self.ttft.observe(req.first_token_at - req.arrival)

    def on_tokens(self, req: EngineRequest, n: int, itl_s: float | None) -> None:
        if not self.log_stats:
            return
        self._gen_pending += n
        if itl_s is not None:
            self.itl.observe(itl_s)

    def on_spec(self, drafts: int, draft_tokens: int, accepted: int, per_pos: list[int]) -> None:
        if not self.log_stats or not self.spec_k:
            return
        self.drafts.inc(drafts)
        self.draft_tokens.inc(draft_tokens)
        self.accepted.inc(accepted)
        for child, v in zip(self.per_pos, per_pos, strict=False):
            if v:
                child.inc(v)

    def on_finished(self, req: EngineRequest) -> None:
        if not self.log_stats:
            return
        reason = req.finish_reason or "error"
        self.success[reason].inc()
        if reason == "abort":
            return
        end = req.finished_at if req.finished_at is not None else req.arrival
        sched = req.scheduled_at if req.scheduled_at is not None else req.arrival
        first = req.first_token_at if req.first_token_at is not None else end
        n_out = len(req.output)
        self.req_prompt.observe(req.num_prompt_tokens)
        self.kv_computed.observe(req.num_prompt_tokens)
        self.req_gen.observe(n_out)
        self.max_gen.observe(req.max_tokens)
        self.params_max_tokens.observe(req.max_tokens)
        self.params_n.observe(req.n_param)
        self.e2e.observe(end - req.arrival)
        self.queue.observe(sched - req.arrival)
        self.inference.observe(end - sched)
        self.prefill.observe(first - sched)
        self.decode.observe(end - first)
        if n_out > 1:
            self.tpot.observe((end - first) / (n_out - 1))

    # --- exposition -----------------------------------------------------------------
    def refresh(self) -> None:
        """Set the gauges from the engine's current state (called before each scrape)."""
        if not self.log_stats:
            return
        if self._gen_pending:
            self.generation_tokens.inc(self._gen_pending)
            self._gen_pending = 0
        if self._prompt_pending:
            n, self._prompt_pending = self._prompt_pending, 0
            self.prompt_tokens.inc(n)
            self.prompt_local.inc(n)
            self.prefix_queries.inc(n)
        eng = self.engine
        if eng is None:
            return
        self.running.set(eng.num_running)
        self.waiting.set(eng.num_waiting)
        self.waiting_capacity.set(eng.num_waiting)
        self.kv.set(eng.kv_usage())

    def render(self) -> bytes:
        self.refresh()
        return generate_latest(self.registry)
