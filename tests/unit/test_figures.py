"""Tests of analysis.figures: goodput checked by hand on one record's per-request TTFT/TPOT,
tail percentiles, energy per token and per-GPU throughput."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servesweep.analysis import figures, stats
from servesweep.config.schema import SloConfig
from servesweep.measure.records import BenchRecord

# One record, six requests sent over 2.0 s; per request: TTFT (s), output tokens, ITLs (s).
#   r0: 0.5 s, 5 tokens, 4 x 40 ms -> TPOT 40 ms   ttft ok  tpot ok   -> good
#   r1: 1.5 s, 5 tokens, 4 x 60 ms -> TPOT 60 ms   ttft ok  tpot no
#   r2: 2.5 s, 5 tokens, 4 x 30 ms -> TPOT 30 ms   ttft no  tpot ok
#   r3: 1.0 s, 1 token,  no ITL    -> TPOT undefined (met)   -> good
#   r4: 3.0 s, 3 tokens, 2 x 50 ms -> TPOT 50 ms   ttft no  tpot ok (<= 50)
#   r5: failed ("boom")                             meets nothing
# SLO ttft_ms 2000, tpot_ms 50: TTFT met by r0 r1 r3 (3/6 = 50 %), TPOT by r0 r2 r3 r4
# (4/6 = 66.7 %), both by r0 r3 (2/6 = 33.3 %); goodput 2 req / 2 s = 1 req/s and
# (5 + 1) tokens / 2 s = 3 tok/s.
RECORD = BenchRecord(
    duration=2.0,
    completed=5,
    ttfts=[0.5, 1.5, 2.5, 1.0, 3.0, 0.2],
    output_lens=[5, 5, 5, 1, 3, 4],
    itls=[[0.04] * 4, [0.06] * 4, [0.03] * 4, [], [0.05, 0.05], [0.01] * 3],
    errors=["", "", "", "", "", "boom"],
)


def test_goodput_by_hand():
    details = stats.request_details(RECORD)
    got = figures.goodput_figures(
        details, slo=SloConfig(ttft_ms=2000, tpot_ms=50), duration_s=RECORD.duration
    )
    assert got["slo_ttft_pct"] == pytest.approx(50.0)
    assert got["slo_tpot_pct"] == pytest.approx(100 * 4 / 6)
    assert got["slo_pct"] == pytest.approx(100 * 2 / 6)
    assert got["goodput_rps"] == pytest.approx(1.0)
    assert got["goodput_tps"] == pytest.approx(3.0)
    assert math.isnan(got["slo_e2e_pct"])  # not configured


def test_one_slo_and_none():
    details = stats.request_details(RECORD)
    ttft_only = figures.goodput_figures(details, slo=SloConfig(ttft_ms=1000), duration_s=2.0)
    assert ttft_only["slo_pct"] == pytest.approx(100 * 2 / 6)  # r0 (500), r3 (1000)
    assert math.isnan(ttft_only["slo_tpot_pct"])
    none = figures.goodput_figures(details, slo=SloConfig(), duration_s=2.0)
    assert all(math.isnan(v) for v in none.values())
    no_details = figures.goodput_figures(None, slo=SloConfig(ttft_ms=1), duration_s=2.0)
    assert all(math.isnan(v) for v in no_details.values())


def test_tail_percentiles_from_details():
    tails = figures.tail_figures(stats.request_details(RECORD))
    ttft_ms = [500, 1500, 2500, 1000, 3000]
    assert tails["ttft_p90_ms"] == pytest.approx(np.percentile(ttft_ms, 90))
    assert tails["ttft_p99_9_ms"] == pytest.approx(np.percentile(ttft_ms, 99.9))
    assert tails["tpot_p99_ms"] == pytest.approx(np.percentile([40, 60, 30, 50], 99))
    itl = [40] * 4 + [60] * 4 + [30] * 4 + [50, 50]
    assert tails["itl_p95_ms"] == pytest.approx(np.percentile(itl, 95))
    assert "ttft_p99_9_ms" in figures.TAIL_COLUMNS
    assert all(math.isnan(v) for v in figures.tail_figures(None).values())


def test_efficiency_figures():
    metrics = {
        "total_output_tokens": 1000,
        "total_input_tokens": 8000,
        "output_tps": 500.0,
        "input_tps": 4000.0,
        "tpot_p50_ms": 20.0,
    }
    gpu = {"gpu_energy_j": 2000.0, "gpu_power_mean_w": 1000.0}
    got = figures.efficiency_figures(metrics=metrics, gpu=gpu, prefill_gpus=8, decode_gpus=4)
    assert got == {
        "joules_per_output_token": 2.0,
        "joules_per_input_token": 0.25,
        "output_tokens_per_watt": 0.5,
        "input_tps_per_gpu": 500.0,
        "output_tps_per_gpu": 125.0,
        "interactivity_tps": 50.0,
    }
    no_energy = figures.efficiency_figures(
        metrics={**metrics, "tpot_p50_ms": math.nan}, gpu={}, prefill_gpus=8, decode_gpus=8
    )
    assert math.isnan(no_energy["joules_per_output_token"])
    assert math.isnan(no_energy["interactivity_tps"])  # TPOT undefined (1-token outputs)
    assert no_energy["output_tps_per_gpu"] == 62.5


def test_tail_percentiles_are_numpys_exactly() -> None:
    """tail_figures' own percentile of sorted values (np.percentile's per-call overhead
    dominated large results.csv) is np.percentile's linear method to the last bit."""
    import numpy as np

    from servesweep.analysis.figures import TAIL_PERCENTILES, _percentile_of_sorted

    rng = np.random.default_rng(3)
    qs = sorted({q for v in TAIL_PERCENTILES.values() for q in v} | {0.0, 50.0, 100.0})
    for n in (1, 2, 3, 7, 40, 1001):
        values = rng.lognormal(0.0, 1.0, n)
        for q in qs:
            assert _percentile_of_sorted(np.sort(values), q) == float(np.percentile(values, q))
