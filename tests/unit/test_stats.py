"""Tests of analysis.stats: hierarchical bootstrap, intervals and verdicts on known data."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servesweep.analysis import stats
from servesweep.measure.records import BenchRecord

TTFT_METRICS = ("ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms")


def repeat_data(
    rng: np.random.Generator,
    *,
    scale: float,
    n_requests: int = 60,
    repeat_sd: float = 0.02,
    sigma: float = 0.25,
) -> tuple[dict[str, float], stats.Requests]:
    """One repeat: lognormal TTFTs (ms) times a repeat-level factor; record = their figures."""
    factor = scale * (1.0 + repeat_sd * rng.standard_normal())
    ttft = np.sort(factor * rng.lognormal(np.log(500.0), sigma, n_requests))
    e2e = np.sort(ttft + factor * 40.0)
    reqs = stats.Requests(ttft=ttft, e2e=e2e, tpot=np.array([]))
    record = {
        "ttft_p50_ms": float(np.median(ttft)),
        "ttft_p95_ms": float(np.percentile(ttft, 95)),
        "ttft_p99_ms": float(np.percentile(ttft, 99)),
        "e2e_p50_ms": float(np.median(e2e)),
        "input_tps": 60000.0 / factor,
    }
    return record, reqs


def cell_data(
    seed: int, *, scale: float, repeats: int = 3, **kw: float
) -> tuple[dict[str, np.ndarray], list[stats.Requests]]:
    rng = np.random.default_rng(seed)
    rows = [repeat_data(rng, scale=scale, **kw) for _ in range(repeats)]
    values = {m: np.array([r[m] for r, _ in rows]) for m in rows[0][0]}
    return values, [q for _, q in rows]


def replicates(seed: int, *, scale: float, key: str, requests: bool = True, **kw):
    values, reqs = cell_data(seed, scale=scale, **kw)
    reps = stats.cell_replicates(values=values, requests=reqs if requests else None, key=key)
    return values, reps


# ---------------------------------------------------------------- per-request data


def test_requests_of_a_record_with_details():
    record = BenchRecord(
        ttfts=[0.5, 0.0, 0.25, 0.75],
        itls=[[0.01, 0.02], [], [0.03, 0.03], [0.01, 0.01]],
        output_lens=[3, 0, 3, 3],
        errors=["", "HTTP 500", "", ""],
    )
    reqs = stats.requests_of(record)
    assert reqs is not None
    assert reqs.ttft == pytest.approx([250.0, 500.0, 750.0])  # ms, failed one left out, sorted
    assert reqs.e2e == pytest.approx([310.0, 530.0, 770.0])  # ttft + sum(itls)
    assert reqs.tpot == pytest.approx([10.0, 15.0, 30.0])  # sum(itls) / (output_len - 1)


def test_details_of_a_response_that_did_not_stream_have_no_tpot_or_itl():
    # the builtin's and bench_serving's non-streamed request: TTFT = latency, no ITL (TPOT 0)
    record = BenchRecord(ttfts=[0.9, 0.8], itls=[[], []], output_lens=[16, 16], errors=["", ""])
    assert stats.request_details(record).tpot == pytest.approx([0.0, 0.0])  # streamed: 0
    details = stats.request_details(record, stream=False)
    assert np.isnan(details.tpot).all() and details.itl.size == 0
    assert details.ttft == pytest.approx([900.0, 800.0])
    assert details.e2e == pytest.approx(details.ttft)
    streamed = BenchRecord(ttfts=[0.5], itls=[[0.01, 0.03]], output_lens=[3], errors=[""])
    assert stats.request_details(streamed, stream=False).itl.size == 0


def test_requests_of_one_token_outputs_and_missing_details():
    one = BenchRecord(ttfts=[0.1, 0.2], itls=[[], []], output_lens=[1, 1], errors=["", ""])
    reqs = stats.requests_of(one)
    assert reqs is not None and reqs.tpot.size == 0
    assert reqs.e2e == pytest.approx(reqs.ttft)
    assert stats.requests_of(BenchRecord(median_ttft_ms=1.0)) is None
    assert stats.requests_of(BenchRecord(ttfts=[0.1], itls=[[], []])) is None
    assert stats.requests_of(BenchRecord(ttfts=[0.1], itls=[[]], errors=["a", "b"])) is None
    assert stats.requests_of(BenchRecord(ttfts=[0.0], itls=[[]], errors=["timeout"])) is None


@pytest.mark.parametrize("stat", [0.0, 50.0, 95.0, 99.0, 100.0, "mean"])
@pytest.mark.parametrize("m", [1, 2, 7, 40])
def test_figure_stat_is_numpys_percentile(stat, m):
    v = np.sort(np.random.default_rng(m).lognormal(size=m))
    want = v.mean() if stat == "mean" else np.percentile(v, stat)
    assert stats.figure_stat(v, stat) == pytest.approx(want)


# ---------------------------------------------------------------- counting


@pytest.mark.parametrize(
    ("n", "distinct", "coarse"), [(1, 1, True), (3, 10, True), (4, 35, True), (5, 126, False)]
)
def test_distinct_resamples_and_coarseness(n, distinct, coarse):
    assert stats.distinct_resamples(n) == distinct
    assert stats.is_coarse(n) is coarse


# ---------------------------------------------------------------- cell replicates


def test_interval_contains_the_point_estimate():
    values, reps = replicates(1, scale=1.0, key="cell")
    for metric, vals in values.items():
        r = reps[metric]
        assert r is not None and r.values.shape == (stats.REPLICATES,)
        low, high = stats.interval(r.values)
        point = float(np.median(vals))
        assert low <= point <= high, metric
        assert low < high, metric
    assert reps["ttft_p50_ms"].resampled == "repeats+requests"
    assert reps["input_tps"].resampled == "repeats"


def test_request_resampling_widens_the_interval_and_is_anchored():
    values, with_requests = replicates(2, scale=1.0, key="c")
    _, repeats_only = replicates(2, scale=1.0, key="c", requests=False)
    for metric in TTFT_METRICS:
        lo_r, hi_r = stats.interval(with_requests[metric].values)
        lo_0, hi_0 = stats.interval(repeats_only[metric].values)
        assert lo_r < lo_0 and hi_r > hi_0, metric
    # Record values far from the per-request figures: the interval follows the record.
    shifted = {m: v + 1000.0 for m, v in values.items()}
    _, reqs = cell_data(2, scale=1.0)
    moved = stats.cell_replicates(values=shifted, requests=reqs, key="c")
    for metric in TTFT_METRICS:
        assert moved[metric].values == pytest.approx(with_requests[metric].values + 1000.0)


def test_deterministic_with_the_seed():
    values, reqs = cell_data(3, scale=1.0)
    a = stats.cell_replicates(values=values, requests=reqs, key="k")
    b = stats.cell_replicates(values=values, requests=reqs, key="k")
    other_seed = stats.Bootstrap(seed=stats.SEED + 1)
    c = stats.cell_replicates(values=values, requests=reqs, key="k", bootstrap=other_seed)
    d = stats.cell_replicates(values=values, requests=reqs, key="another cell")
    for m in values:
        assert np.array_equal(a[m].values, b[m].values)
        assert not np.array_equal(a[m].values, c[m].values)
        assert not np.array_equal(a[m].values, d[m].values)


def test_metric_order_and_subsets_do_not_change_a_metric():
    values, reqs = cell_data(4, scale=1.0)
    full = stats.cell_replicates(values=values, requests=reqs, key="k")
    alone = stats.cell_replicates(values={"input_tps": values["input_tps"]}, requests=reqs, key="k")
    assert np.array_equal(full["input_tps"].values, alone["input_tps"].values)
    assert list(full) == list(values)


def test_missing_values_are_left_out():
    values, reqs = cell_data(5, scale=1.0)
    values["ttft_p95_ms"] = np.array([np.nan, np.nan, np.nan])  # an old record version
    values["input_tps"] = np.array([100.0, np.nan, 300.0])
    reps = stats.cell_replicates(values=values, requests=reqs, key="k")
    assert reps["ttft_p95_ms"] is None
    assert reps["input_tps"].n_repeats == 2
    assert set(np.unique(reps["input_tps"].values)) <= {100.0, 200.0, 300.0}


def test_small_chunks_give_the_same_kind_of_answer(monkeypatch):
    values, reqs = cell_data(6, scale=1.0, n_requests=50)
    monkeypatch.setattr(stats, "CHUNK_ELEMENTS", 120)  # 2 requests-resamples per chunk
    reps = stats.cell_replicates(values=values, requests=reqs, key="k")
    low, high = stats.interval(reps["ttft_p99_ms"].values)
    assert low <= np.median(values["ttft_p99_ms"]) <= high
    assert np.isfinite(reps["ttft_p99_ms"].values).all()


def test_three_repeats_record_only_interval_is_min_max():
    values = {"input_tps": np.array([90.0, 100.0, 110.0])}
    r = stats.cell_replicates(values=values, requests=None, key="k")["input_tps"]
    assert stats.interval(r.values) == (90.0, 110.0)
    assert r.coarse and r.spread_known and r.n_repeats == 3
    assert set(np.unique(r.values)) == {90.0, 100.0, 110.0}


def test_one_repeat_does_not_crash_and_is_flagged():
    values, reqs = cell_data(7, scale=1.0, repeats=1)
    with_requests = stats.cell_replicates(values=values, requests=reqs, key="k")
    record_only = stats.cell_replicates(values=values, requests=None, key="k")
    r = with_requests["ttft_p50_ms"]
    assert r.coarse and r.spread_known  # request-level noise only
    low, high = stats.interval(r.values)
    assert low < values["ttft_p50_ms"][0] < high
    flat = record_only["ttft_p50_ms"]
    assert flat.coarse and not flat.spread_known
    assert stats.interval(flat.values) == (values["ttft_p50_ms"][0],) * 2
    faster = stats.Replicates(flat.values * 0.5, 1, False)
    assert stats.compare_replicates(faster, flat, better="lower") == stats.Delta(
        None, None, "unknown", True
    )
    d = stats.compare_replicates(with_requests["ttft_p50_ms"], r, better="lower")
    assert d.verdict == "within noise" and d.coarse


class RecordingRng:
    """A numpy Generator that keeps a copy of every array `integers` returns, in order."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.draws: list[np.ndarray] = []

    def integers(self, *args, **kwargs):
        out = self.rng.integers(*args, **kwargs)
        self.draws.append(out.copy())
        return out


def test_each_drawn_repeat_gets_its_own_resample_of_its_requests(monkeypatch):
    # The vectorised draw against a slot-by-slot computation of the hierarchical bootstrap:
    # replicate b draws repeats picks[b]; each slot resamples its repeat's requests (one row
    # of positions, served in row-major slot order per request count), recomputes the figure
    # with numpy, anchors it on the record value; the replicate is the median over slots.
    rng = np.random.default_rng(8)
    counts = [30, 25, 30, 25]  # unequal request counts (failed requests); even repeat count
    reqs = []
    for m in counts:
        ttft = np.sort(rng.lognormal(np.log(500.0), 0.25, m))
        reqs.append(stats.Requests(ttft=ttft, e2e=np.sort(ttft + 40.0), tpot=np.array([])))
    values = {
        "ttft_p50_ms": rng.normal(500.0, 10.0, 4),
        "ttft_p99_ms": rng.normal(900.0, 30.0, 4),
        "ttft_mean_ms": rng.normal(520.0, 10.0, 4),
        "e2e_p50_ms": rng.normal(560.0, 10.0, 4),
        "input_tps": np.array([90.0, 100.0, 110.0, 120.0]),
    }
    streams: list[RecordingRng] = []

    def recording(bootstrap, *parts):
        streams.append(RecordingRng(len(streams)))
        return streams[-1]

    monkeypatch.setattr(stats, "_rng", recording)
    monkeypatch.setattr(stats, "CHUNK_ELEMENTS", 1000)  # several chunks per request count
    reps = stats.cell_replicates(
        values=values, requests=reqs, key="k", bootstrap=stats.Bootstrap(replicates=150)
    )
    requests_stream, record_stream = streams
    picks, *chunks = requests_stream.draws
    pools = {m: np.concatenate([c for c in chunks if c.shape[1] == m]) for m in set(counts)}
    served = dict.fromkeys(pools, 0)
    metrics = [m for m in values if m != "input_tps"]
    per_slot = np.empty((len(metrics), picks.size))
    for slot, j in enumerate(picks.ravel()):
        m = counts[j]
        positions, served[m] = pools[m][served[m]], served[m] + 1
        for k, metric in enumerate(metrics):
            name, stat = stats.REQUEST_METRICS[metric]
            own = reqs[j].figure(name)
            figure = np.mean if stat == "mean" else lambda v, q=stat: np.percentile(v, q)
            per_slot[k, slot] = figure(own[positions]) + values[metric][j] - figure(own)
    assert served == {m: len(p) for m, p in pools.items()}  # every drawn row used once
    expected = np.median(per_slot.reshape(len(metrics), *picks.shape), axis=2)
    for k, metric in enumerate(metrics):
        assert reps[metric].requests and reps[metric].n_repeats == 4
        assert reps[metric].values == pytest.approx(expected[k], rel=1e-12), metric
    (record_picks,) = record_stream.draws
    want = np.median(values["input_tps"][record_picks], axis=1)
    assert np.array_equal(reps["input_tps"].values, want)


# ---------------------------------------------------------------- deltas and verdicts


@pytest.mark.parametrize("use_requests", [True, False])
def test_clear_20_percent_effect(use_requests):
    # Enough requests for stable tails: with 60 requests p95/p99 ranges of 3 repeats overlap.
    kw = {"requests": use_requests, "n_requests": 200, "sigma": 0.15}
    _, base = replicates(10, scale=1.0, key="base", **kw)
    _, fast = replicates(11, scale=0.8, key="fast", **kw)
    _, slow = replicates(12, scale=1.25, key="slow", **kw)
    for metric in (*TTFT_METRICS, "e2e_p50_ms"):
        d = stats.compare_replicates(fast[metric], base[metric], better="lower")
        assert d.verdict == "better", metric
        assert d.high < 0 and d.coarse
        assert stats.compare_replicates(slow[metric], base[metric], better="lower").verdict == (
            "worse"
        )
    # Throughput: 25% higher for the fast cell is better, 20% lower for the slow one worse.
    up = stats.compare_replicates(fast["input_tps"], base["input_tps"], better="higher")
    assert up.verdict == "better" and up.low > 0
    down = stats.compare_replicates(slow["input_tps"], base["input_tps"], better="higher")
    assert down.verdict == "worse" and down.high < 0


def test_identical_distributions_are_within_noise():
    _, a = replicates(20, scale=1.0, key="a")
    _, b = replicates(21, scale=1.0, key="b")
    _, same = replicates(20, scale=1.0, key="a-again")  # the very same data, resampled anew
    for metric in ("ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "input_tps"):
        better = "higher" if metric == "input_tps" else "lower"
        assert stats.compare_replicates(b[metric], a[metric], better=better).verdict == (
            "within noise"
        ), metric
        d = stats.compare_replicates(same[metric], a[metric], better=better)
        assert d.verdict == "within noise" and d.low < 0 < d.high


def test_delta_interval_contains_the_point_delta():
    values_a, a = replicates(30, scale=1.0, key="a")
    values_b, b = replicates(31, scale=0.9, key="b")
    for metric in values_a:
        point = 100 * (np.median(values_b[metric]) / np.median(values_a[metric]) - 1)
        better = "higher" if metric == "input_tps" else "lower"
        d = stats.compare_replicates(b[metric], a[metric], better=better)
        assert d.low <= point <= d.high, metric


@pytest.mark.parametrize(
    ("low", "high", "better", "want"),
    [
        (-30.0, -5.0, "lower", "better"),
        (5.0, 30.0, "lower", "worse"),
        (5.0, 30.0, "higher", "better"),
        (-30.0, -5.0, "higher", "worse"),
        (-5.0, 5.0, "lower", "within noise"),
        (0.0, 5.0, "higher", "within noise"),
        (None, None, "lower", "unknown"),
    ],
)
def test_verdict_rule(low, high, better, want):
    assert stats.verdict(low=low, high=high, better=better) == want


def test_verdict_rejects_unknown_direction_and_bad_settings():
    with pytest.raises(ValueError, match="better"):
        stats.verdict(low=1.0, high=2.0, better="sideways")
    with pytest.raises(ValueError, match="replicates"):
        stats.Bootstrap(replicates=0)
    with pytest.raises(ValueError, match="level"):
        stats.Bootstrap(level=1.0)


def test_delta_with_zero_baseline_and_missing_side():
    zero = stats.Replicates(np.zeros(10), 3, False)
    one = stats.Replicates(np.ones(10), 3, False)
    assert stats.compare_replicates(one, zero, better="lower").verdict == "unknown"
    assert stats.compare_replicates(None, one, better="lower") == stats.Delta(
        None, None, "unknown", True
    )


def test_method_block():
    block = stats.method(
        bootstrap=stats.Bootstrap(replicates=500, seed=7),
        repeats=[3, 3, 1],
        resampled={"ttft_p50_ms": "repeats+requests", "input_tps": "repeats"},
    )
    assert block["replicates"] == 500 and block["seed"] == 7 and block["level"] == 0.95
    assert block["repeats"] == {
        "1": {"cells": 1, "distinct_repeat_resamples": 1, "coarse": True},
        "3": {"cells": 2, "distinct_repeat_resamples": 10, "coarse": True},
    }
    assert block["resampled"]["input_tps"] == "repeats"
    assert block["verdicts"] == ["better", "worse", "within noise", "unknown"]
    assert any("i.i.d. within a repeat" in a for a in block["assumptions"])
    assert any("drift" in a for a in block["limits"])
    assert "contains 0" in block["verdict_rule"]
    assert math.isclose(block["level"], 0.95)


# ---------------------------------------------------------------- multiplicity


def test_bootstrap_p_value_agrees_with_the_interval():
    rng = np.random.default_rng(1)
    shifted = rng.normal(3.0, 1.0, 2000)  # interval excludes 0
    assert stats.p_value(shifted) < 0.05
    low, _ = stats.interval(shifted)
    assert low > 0
    centred = rng.normal(0.0, 1.0, 2000)
    assert stats.p_value(centred) > 0.5
    assert stats.p_value(np.array([np.nan])) is None
    assert stats.p_value(np.array([1.0, 2.0])) == 0.0


def test_benjamini_hochberg_adjusted_p_values():
    # the textbook example: p sorted 0.01, 0.02, 0.03, 0.04, 0.05 -> all 0.05
    assert stats.fdr_adjusted([0.05, 0.01, 0.03, 0.02, 0.04]) == pytest.approx([0.05] * 5)
    assert stats.fdr_adjusted([0.001, 0.5]) == pytest.approx([0.002, 0.5])
    assert stats.fdr_adjusted([]) == []


def test_one_chance_finding_among_many_tests_is_within_noise():
    # a run against an identical run: 60 tests, one reads -0.4% [-1.6, -0.04] worse (p 0.04)
    tests = [{"p_value": 0.04, "verdict": stats.WORSE}]
    tests += [{"p_value": 0.2 + i / 100, "verdict": stats.NOISE} for i in range(59)]
    tests.append({"p_value": None, "verdict": stats.UNKNOWN})
    assert stats.control_fdr(tests) == 1
    assert tests[0]["verdict"] == stats.NOISE and tests[0]["p_adjusted"] > 0.05
    assert "p_adjusted" not in tests[-1]
    # real changes (p 0 in every replicate) survive, however many tests there are
    real = [{"p_value": 0.0, "verdict": stats.BETTER} for _ in range(49)]
    real += [{"p_value": 0.5, "verdict": stats.NOISE} for _ in range(11)]
    assert stats.control_fdr(real) == 0
    assert [t["verdict"] for t in real].count(stats.BETTER) == 49


def test_the_method_names_the_multiplicity_control():
    described = stats.method(bootstrap=stats.DEFAULT, repeats=[3, 3])
    assert "Benjamini-Hochberg" in described["multiplicity"]
    assert "adjusted" in described["verdict_rule"]
