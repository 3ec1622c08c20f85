"""Metric computation of the builtin client on hand-made request results."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from servesweep.measure.loadgen.metrics import (
    RequestResult,
    build_record,
    compute_metrics,
    record_line,
    request_details,
)
from servesweep.measure.recordkeys import BUILTIN_CLIENT, CLIENT_KEY, DETAIL_KEYS, RECORD_KEYS
from servesweep.measure.records import parse_record_line

SETTINGS = {
    "tag": "t1",
    "backend": "sglang",
    "dataset_name": "random-ids",
    "request_rate": math.inf,
    "max_concurrency": 2,
    "sharegpt_output_len": None,
    "random_input_len": 100,
    "random_output_len": 3,
    "random_range_ratio": 1.0,
}


def ok(start: float, ttft: float, itl: list[float], *, out: int = 3, prompt: int = 100):
    latency = ttft + sum(itl)
    return RequestResult(
        input_len=100,
        prompt_len=prompt,
        success=True,
        latency=latency,
        ttft=ttft,
        itl=itl,
        output_len=out,
        generated_text=" tok" * out,
        start_time=start,
    )


def failed(start: float = 0.0) -> RequestResult:
    return RequestResult(input_len=100, prompt_len=100, error="Internal Server Error: boom")


@pytest.fixture
def results() -> list[RequestResult]:
    return [
        ok(10.0, 0.1, [0.02, 0.04]),
        ok(10.05, 0.3, [0.01, 0.01]),
        failed(),
        ok(11.2, 0.2, [0.05, 0.05], prompt=101),
    ]


def test_totals_and_throughputs_count_successes_only(results):
    m = compute_metrics(results=results, duration_s=2.0)
    assert m["completed"] == 3
    assert m["total_input_tokens"] == 300  # intended lengths, like bench
    assert m["total_input_text_tokens"] == 300
    assert m["total_input_vision_tokens"] == 0
    assert m["total_output_tokens"] == 9
    assert m["total_output_tokens_retokenized"] == 9  # server count: no tokenizer
    assert m["request_throughput"] == pytest.approx(1.5)
    assert m["input_throughput"] == pytest.approx(150.0)
    assert m["output_throughput"] == pytest.approx(4.5)
    assert m["total_throughput"] == pytest.approx(154.5)


def test_latency_statistics_match_numpy(results):
    m = compute_metrics(results=results, duration_s=2.0)
    ttfts = np.array([0.1, 0.3, 0.2])
    e2e = np.array([0.16, 0.32, 0.3])
    itls = np.array([0.02, 0.04, 0.01, 0.01, 0.05, 0.05])
    tpots = (e2e - ttfts) / 2
    for name, arr in (("ttft", ttfts), ("e2e_latency", e2e), ("itl", itls), ("tpot", tpots)):
        assert m[f"mean_{name}_ms"] == pytest.approx(np.mean(arr) * 1000)
        assert m[f"median_{name}_ms"] == pytest.approx(np.median(arr) * 1000)
        assert m[f"std_{name}_ms"] == pytest.approx(np.std(arr) * 1000)
        for q in (90, 95, 99):
            assert m[f"p{q}_{name}_ms"] == pytest.approx(np.percentile(arr, q) * 1000)
    assert m["max_itl_ms"] == pytest.approx(50.0)
    assert m["concurrency"] == pytest.approx(e2e.sum() / 2.0)


def test_tpot_skips_single_token_outputs():
    m = compute_metrics(
        results=[ok(0.0, 0.5, [], out=1), ok(0.0, 0.1, [0.1, 0.3], out=3)], duration_s=1.0
    )
    assert m["mean_tpot_ms"] == pytest.approx(200.0)


def test_peaks_use_one_second_buckets(results):
    m = compute_metrics(results=results, duration_s=2.0)
    # t0 = 10.0; tokens at 10.1, 10.12, 10.16 | 10.35, 10.36, 10.37 | 11.4, 11.45, 11.5
    assert m["max_output_tokens_per_s"] == 6.0
    # requests 1 and 2 live in second 0; request 4 spans [1.2, 1.5] -> second 1 only
    assert m["max_concurrent_requests"] == 2


def test_no_success_gives_zeros_and_nan_e2e():
    m = compute_metrics(results=[failed(), failed()], duration_s=1.0)
    assert m["completed"] == 0
    assert m["mean_ttft_ms"] == 0.0 and m["p99_itl_ms"] == 0.0
    assert math.isnan(m["mean_e2e_latency_ms"])
    assert m["max_concurrent_requests"] == 0


def test_details_keep_dispatch_order_and_zero_failed_outputs(results):
    d = request_details(results)
    assert list(d) == list(DETAIL_KEYS)
    assert d["input_lens"] == [100, 100, 100, 101]  # server-reported prompt_tokens win
    assert d["output_lens"] == [3, 3, 0, 3]
    assert d["errors"][2].startswith("Internal Server Error")
    assert d["itls"][1] == [0.01, 0.01]


def test_record_has_bench_keys_in_order_then_client_then_details(results):
    rec = build_record(
        settings=SETTINGS,
        server_info={"version": "x"},
        accept_length=None,
        duration_s=2.0,
        results=results,
    )
    line = record_line(rec, details=True)
    keys = list(json.loads(line))
    assert keys == [*RECORD_KEYS, CLIENT_KEY, *DETAIL_KEYS]
    assert "Infinity" in line  # bench's json.dumps of the default request rate
    again = parse_record_line(line)
    assert again.completed == 3
    assert again.model_extra[CLIENT_KEY] == BUILTIN_CLIENT
    assert again.max_concurrency == 2 and again.server_info == {"version": "x"}


def test_record_line_without_details_drops_arrays(results):
    rec = build_record(
        settings=SETTINGS, server_info=None, accept_length=None, duration_s=2.0, results=results
    )
    keys = list(json.loads(record_line(rec, details=False)))
    assert keys == [*RECORD_KEYS, CLIENT_KEY]
