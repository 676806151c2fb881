"""The vLLM 0.20.2 metric families of the contract (DESIGN.md section 2), checked against
the pages of the real engines (tests/gpu) and of the emulator (tests/emulator)."""

from __future__ import annotations

# Every family the gateway reads.
READ_BY_GATEWAY = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:generation_tokens",
    "vllm:prompt_tokens",
    "vllm:request_success",
    "vllm:time_to_first_token_seconds",
    "vllm:request_time_per_output_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
)
# Only on engines run with --speculative-config.
SPEC_FAMILIES = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos",
)
# Families that vLLM 0.20.2 does not export (the gateway must not rely on them).
REMOVED = ("vllm:gpu_cache_usage_perc", "vllm:time_per_output_token_seconds")
