"""bench_serving's `calculate_metrics` and record layout, for the builtin client's results."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servesweep.measure.loadgen.selfcheck import SELFCHECK_KEYS
from servesweep.measure.recordkeys import BUILTIN_CLIENT, CLIENT_KEY, DETAIL_KEYS, RECORD_KEYS

# Record keys the builtin adds to bench_serving's: who measured, and its self-check figures.
BUILTIN_EXTRA_KEYS = (CLIENT_KEY, *SELFCHECK_KEYS)


@dataclass
class RequestResult:
    """One request's outcome, field for field like bench_serving's `RequestFuncOutput`."""

    input_len: int  # the intended prompt length (dataset row), used for total_input_tokens
    prompt_len: int  # server-reported `meta_info.prompt_tokens` if any, else input_len
    success: bool = False
    latency: float = 0.0  # s, request start to the last line received
    ttft: float = 0.0  # s, request start to the first chunk with non-empty text
    itl: list[float] = field(default_factory=list)  # s, chunk gaps split per new token
    output_len: int = 0
    generated_text: str = ""
    error: str = ""
    start_time: float = 0.0  # perf_counter() when the request was sent


def _stats(values: list[float], name: str, *, empty_zero: bool) -> dict[str, float]:
    """mean/median/std/p90/p95/p99 in ms, numpy's defaults as bench uses them."""
    if not values:
        # bench feeds `values or 0` for ttft/tpot/itl (-> 0.0) and the bare list for e2e (-> nan)
        fill = 0.0 if empty_zero else math.nan
        return {f"{s}_{name}_ms": fill for s in ("mean", "median", "std", "p90", "p95", "p99")}
    arr = np.asarray(values, dtype=float)
    p90, p95, p99 = np.percentile(arr, [90, 95, 99])
    return {
        f"mean_{name}_ms": float(np.mean(arr)) * 1000,
        f"median_{name}_ms": float(np.median(arr)) * 1000,
        f"std_{name}_ms": float(np.std(arr)) * 1000,
        f"p90_{name}_ms": float(p90) * 1000,
        f"p95_{name}_ms": float(p95) * 1000,
        f"p99_{name}_ms": float(p99) * 1000,
    }


def _peaks(ok: list[RequestResult]) -> tuple[float, int]:
    """Peak output tokens and in-flight requests over 1-second buckets (bench's method)."""
    if not ok:
        return 0.0, 0
    t0 = min(r.start_time for r in ok)
    t1 = max(r.start_time + r.latency for r in ok)
    n_buckets = int(np.ceil(t1 - t0)) + 1
    tokens = np.zeros(n_buckets)
    inflight = np.zeros(n_buckets)
    for r in ok:
        first = r.start_time + r.ttft
        times = np.concatenate(([first], first + np.cumsum(r.itl))) if r.itl else [first]
        buckets = (np.asarray(times) - t0).astype(int)
        buckets = buckets[(buckets >= 0) & (buckets < n_buckets)]
        np.add.at(tokens, buckets, 1)
        begin = int(r.start_time - t0)
        end = min(int(r.start_time + r.latency - t0) + 1, n_buckets)
        inflight[begin:end] += 1
    return float(np.max(tokens)), int(np.max(inflight))


def compute_metrics(
    *,
    results: list[RequestResult],
    duration_s: float,
    retokenize: Callable[[str], int] | None = None,
) -> dict[str, Any]:
    """bench_serving's summary metrics over successful requests, keyed by record field.

    `total_output_tokens_retokenized` counts `generated_text` with `retokenize` when given
    (the sim's word-level count), else it is the server's count (the builtin has no tokenizer
    to re-encode `generated_text` with) and equals `total_output_tokens`.
    Also returns `max_itl_ms`, which bench prints but does not record.
    """
    ok = [r for r in results if r.success]
    output_lens = [r.output_len for r in ok]
    total_input = sum(r.input_len for r in ok)
    total_output = sum(output_lens)
    ttfts = [r.ttft for r in ok]
    tpots = [(r.latency - r.ttft) / (r.output_len - 1) for r in ok if r.output_len > 1]
    itls = [x for r in ok for x in r.itl]
    e2e = [r.latency for r in ok]
    peak_tokens, peak_requests = _peaks(ok)
    return {
        "completed": len(ok),
        "total_input_tokens": total_input,
        "total_input_text_tokens": total_input,
        "total_input_vision_tokens": 0,
        "total_output_tokens": total_output,
        "total_output_tokens_retokenized": (
            sum(retokenize(r.generated_text) for r in ok) if retokenize else total_output
        ),
        "request_throughput": len(ok) / duration_s,
        "input_throughput": total_input / duration_s,
        "output_throughput": total_output / duration_s,
        "total_throughput": (total_input + total_output) / duration_s,
        **_stats(e2e, "e2e_latency", empty_zero=False),
        **_stats(ttfts, "ttft", empty_zero=True),
        **_stats(tpots, "tpot", empty_zero=True),
        **_stats(itls, "itl", empty_zero=True),
        "max_itl_ms": max(itls, default=0.0) * 1000,
        "concurrency": sum(e2e) / duration_s,
        "max_output_tokens_per_s": peak_tokens,
        "max_concurrent_requests": peak_requests,
    }


def request_details(results: list[RequestResult]) -> dict[str, list[Any]]:
    """The `--output-details` arrays, per request in dispatch order (0 output for failures)."""
    return {
        "input_lens": [r.prompt_len for r in results],
        "output_lens": [r.output_len if r.success else 0 for r in results],
        "ttfts": [r.ttft for r in results],
        "itls": [r.itl for r in results],
        "generated_texts": [r.generated_text for r in results],
        "errors": [r.error for r in results],
    }


def build_record(
    *,
    settings: dict[str, Any],
    server_info: dict[str, Any] | None,
    accept_length: float | None,
    duration_s: float,
    results: list[RequestResult],
    retokenize: Callable[[str], int] | None = None,
) -> dict[str, Any]:
    """The full record (summary keys in bench order, the client key, then details), as a plain
    dict like bench's: readers validate it (records.BenchRecord).

    `settings` holds the argument keys: tag, backend, dataset_name, request_rate,
    max_concurrency, sharegpt_output_len, random_input_len, random_output_len,
    random_range_ratio.
    """
    metrics = compute_metrics(results=results, duration_s=duration_s, retokenize=retokenize)
    values = {
        **settings,
        **metrics,
        "server_info": server_info,
        "duration": duration_s,
        "accept_length": accept_length,
    }
    data = {key: values[key] for key in RECORD_KEYS}
    data[CLIENT_KEY] = BUILTIN_CLIENT
    data.update(request_details(results))
    return data


def record_line(data: dict[str, Any], *, details: bool) -> str:
    """One JSONL line in bench's key order; the per-request arrays only with `details`."""
    keys = [k for k in RECORD_KEYS if k in data]
    keys += [k for k in data if k not in RECORD_KEYS and k not in DETAIL_KEYS]
    if details:
        keys += [k for k in DETAIL_KEYS if k in data]
    return json.dumps({k: data[k] for k in keys}) + "\n"
