"""The bench record's key layout (SGLang bench_serving's JSONL), without pydantic: the builtin
client's process imports it, and records.BenchRecord validates what it wrote."""

from __future__ import annotations

# bench_serving 0.5.23 record keys, in order (SGLANG.md 1.6); older versions have a subset.
RECORD_KEYS = [
    "tag",
    "backend",
    "dataset_name",
    "request_rate",
    "max_concurrency",
    "sharegpt_output_len",
    "random_input_len",
    "random_output_len",
    "random_range_ratio",
    "server_info",
    "duration",
    "completed",
    "total_input_tokens",
    "total_input_text_tokens",
    "total_input_vision_tokens",
    "total_output_tokens",
    "total_output_tokens_retokenized",
    "request_throughput",
    "input_throughput",
    "output_throughput",
    "total_throughput",
    "mean_e2e_latency_ms",
    "median_e2e_latency_ms",
    "std_e2e_latency_ms",
    "p90_e2e_latency_ms",
    "p95_e2e_latency_ms",
    "p99_e2e_latency_ms",
    "mean_ttft_ms",
    "median_ttft_ms",
    "std_ttft_ms",
    "p90_ttft_ms",
    "p95_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "std_tpot_ms",
    "p90_tpot_ms",
    "p95_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "std_itl_ms",
    "p90_itl_ms",
    "p95_itl_ms",
    "p99_itl_ms",
    "concurrency",
    "accept_length",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
]
DETAIL_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors")
# Extra record key the builtin client adds (bench_serving has no such key): which client
# wrote the record, and the value naming the builtin.
CLIENT_KEY = "client"
BUILTIN_CLIENT = "servesweep.measure.loadgen.builtin"
