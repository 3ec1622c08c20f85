"""Tests of servesweep.analysis.results: raw records -> results.csv, on the default matrix."""

from __future__ import annotations

import json
import math
from functools import partial

import pandas as pd
import pytest

from servesweep.analysis import results, summary
from servesweep.analysis.cautions import cautions
from servesweep.config.load import load_experiment_file
from servesweep.config.matrix import cell_repeats
from servesweep.config.schema import SaturationConfig
from servesweep.core import parallel
from servesweep.core.errors import CellFailed
from servesweep.measure import servermetrics
from servesweep.measure.loadgen import builtin, usage
from servesweep.measure.loadgen.metrics import RequestResult, build_record
from servesweep.measure.records import BenchRecord, read_record, write_record
from tests.support.runs import (
    REC_0523,
    REC_059,
    REC_BUILTIN,
    REPO,
    collect,
    detailed_template,
    experiment,
    make_run,
    request_details,
    template,
)

# ---------------------------------------------------------------- record_metrics


def test_record_metrics_of_bench_serving_0523():
    raw = template(REC_0523)
    m = results.record_metrics(read_record(REC_0523))
    assert list(m) == [*results.METRICS, *results.DERIVED]
    for column, key in results.METRICS.items():
        if key.startswith("client_") or column in results.TOKEN_TIMING:
            # the builtin's self-check: bench_serving has none; TPOT/ITL of 1-token outputs
            assert math.isnan(m[column]), column
            continue
        assert m[column] == pytest.approx(raw[key]), column
    assert m["ttft_p50_ms"] == raw["median_ttft_ms"]
    assert m["input_tps"] == raw["input_throughput"]
    assert m["completed"] == 40 and isinstance(m["completed"], int)
    assert m["total_input_tokens"] == 40 * 16384
    # bench_serving reports 0.0 when every output is 1 token: undefined, so blank
    assert raw["median_tpot_ms"] == 0.0 and raw["median_itl_ms"] == 0.0
    assert math.isnan(m["tpot_p50_ms"]) and math.isnan(m["itl_p50_ms"])


def test_record_metrics_keep_tpot_of_multi_token_outputs():
    raw = {**template(REC_0523), "total_output_tokens": 80, "median_tpot_ms": 5.0}
    assert results.record_metrics(raw)["tpot_p50_ms"] == 5.0


def test_record_metrics_of_bench_serving_059_lacks_p95():
    m = results.record_metrics(template(REC_059))  # a plain dict works too
    assert math.isnan(m["ttft_p95_ms"])
    assert math.isnan(m["tpot_p95_ms"])
    assert m["ttft_p99_ms"] == template(REC_059)["p99_ttft_ms"]
    assert results.check_record(template(REC_059)) == []


def test_record_metrics_of_builtin_client():
    m = results.record_metrics(BenchRecord.model_validate(template(REC_BUILTIN)))
    assert m["tpot_p50_ms"] == pytest.approx(template(REC_BUILTIN)["median_tpot_ms"])
    assert m["tpot_p50_ms"] > 5
    assert m["total_output_tokens"] == 24 * 128


def test_record_metrics_missing_and_bad_values():
    m = results.record_metrics({"median_ttft_ms": 12.5, "completed": 3})
    assert m["ttft_p50_ms"] == 12.5
    assert m["completed"] == 3
    assert math.isnan(m["input_tps"])
    assert results.check_record({"median_ttft_ms": 12.5, "completed": 3})  # not analysable
    with pytest.raises(ValueError, match="median_ttft_ms"):
        results.record_metrics({"median_ttft_ms": "fast"})


PROCESS = {"wall_s": 10.0, "cpu_user_s": 8.0, "cpu_sys_s": 1.0, "max_rss_kb": 9e4, "returncode": 0}


def test_client_process_columns_and_the_saturation_rule_without_a_self_check():
    bench = template(REC_0523)  # bench_serving: no in-window self-check
    m = results.record_metrics(bench)
    assert all(math.isnan(m[c]) for c in usage.COLUMNS)  # no figures (an imported run)
    assert math.isnan(results._saturated(m, SaturationConfig()))
    m = results.record_metrics({**bench, usage.RECORD_KEY: PROCESS})
    assert m["client_process_wall_s"] == 10.0
    assert m["client_process_cpu_s"] == 9.0
    assert m["client_process_cpu_pct"] == 90.0
    assert results._saturated(m, SaturationConfig(cpu_pct=85)) is True
    assert results._saturated(m, SaturationConfig(cpu_pct=90)) is True  # at the limit
    assert results._saturated(m, SaturationConfig(cpu_pct=95)) is False


def test_the_builtin_keeps_its_in_window_rule_beside_the_process_figures():
    calm = {"client_cpu_pct": 40.0, "client_loop_lag_p99_ms": 1.0}
    m = results.record_metrics({**template(REC_BUILTIN), **calm, usage.RECORD_KEY: PROCESS})
    assert m["client_process_cpu_pct"] == 90.0  # start-up included
    assert results._saturated(m, SaturationConfig(cpu_pct=90)) is False


def test_a_loop_lag_small_against_the_ttft_does_not_flag_the_builtin():
    # the default run on a shared 2-core host: CPU 3.5%, lag p99 9 ms, TTFT p50 600 ms
    idle = {"client_cpu_pct": 3.5, "client_loop_lag_p99_ms": 9.0, "ttft_p50_ms": 600.0}
    assert results.lag_limit_ms(idle, SaturationConfig()) == 30.0
    assert results._saturated(idle, SaturationConfig()) is False
    assert results._saturated({**idle, "client_loop_lag_p99_ms": 31.0}, SaturationConfig())
    assert results._saturated({**idle, "client_cpu_pct": 95.0}, SaturationConfig()) is True
    # short TTFTs: the configured limit (5 ms) still holds
    fast = {**idle, "ttft_p50_ms": 20.0, "client_loop_lag_p99_ms": 6.0}
    assert results.lag_limit_ms(fast, SaturationConfig()) == 5.0
    assert results._saturated(fast, SaturationConfig()) is True
    assert results._saturated({**fast, "ttft_p50_ms": math.nan}, SaturationConfig()) is True


# ---------------------------------------------------------------- collect_results


def test_collect_results_default_matrix(tmp_path):
    exp = experiment()
    paths = make_run(tmp_path, exp)
    cells = cell_repeats(exp)
    df = collect(cells, paths)[0]
    assert len(df) == 24
    assert list(df.columns) == [
        "run_id",
        "server_id",
        "client_id",
        "repeat",
        "seed",
        "fingerprint",
        "pool",
        "engine_kind",
        "sim_time_scale",
        "moe_runner_backend",
        "chunked_prefill_size",
        "concurrency",
        "tp_size",
        "ep_size",
        "dp_size",
        "pp_size",
        *results.METRICS,
        *results.DERIVED,
        *results.GPU_COLUMNS,
        *results.FIGURE_COLUMNS,
        "cache_flushed",
        "start_ready_s",
        "start_imports_s",
        "start_load_weight_s",
        "start_cuda_graph_s",
        "start_warmup_s",
        *servermetrics.COLUMNS,  # the server's side, from each record (blank: none recorded)
        *results.SIM_COLUMNS,
    ]
    assert set(df["run_id"]) == {"moe-prefill-sim"}
    assert df[list(usage.COLUMNS)].isna().all().all()  # records without the wrapper's figures
    # One seed per client config and repeat, the same for every server config (docs/identity.md)
    assert list(df["seed"]) == [c.seed for c in cells]
    assert df.groupby(["client_id", "repeat"])["seed"].nunique().eq(1).all()
    assert df.drop_duplicates(["client_id", "repeat"])["seed"].is_unique
    assert set(df["ep_size"]) == {8} and set(df["tp_size"]) == {8}  # not an axis, still a column
    assert list(df["server_id"]) == [c.server.id for c in cells]
    assert list(df["fingerprint"]) == [c.server.fingerprint for c in cells]
    assert list(df["repeat"]) == [1, 2, 3] * 8
    assert df["server_id"].iloc[0] == "moe_runner_backend~marlin,chunked_prefill_size~8192"
    row = df[
        (df.moe_runner_backend == "flashinfer_mxfp4")
        & (df.chunked_prefill_size == 16384)
        & (df.concurrency == 16)
        & (df.repeat == 2)
    ].iloc[0]
    factor = 0.9 * 1.05 * 1.8 * 1.02
    assert row["ttft_p50_ms"] == pytest.approx(template(REC_0523)["median_ttft_ms"] * factor)
    assert row["input_tps"] == pytest.approx(template(REC_0523)["input_throughput"] / factor)
    assert row["gpu_status"] == "ok"
    assert row["gpu_count"] == 8
    assert row["gpu_mem_used_peak_mib"] == 21491
    assert row["gpu_util_mean_pct"] == 100


def test_records_read_in_worker_processes_give_the_same_tables(tmp_path, monkeypatch):
    monkeypatch.setattr(parallel, "MIN_PER_WORKER", 1)  # 24 cell-repeats: fork anyway
    exp = experiment()
    paths = make_run(tmp_path / "run", exp, base=detailed_template(tmp_path))
    cells = cell_repeats(exp)
    one, one_requests = collect(cells, paths)
    three, three_requests = collect(cells, paths, workers=3)
    pd.testing.assert_frame_equal(three, one)
    pd.testing.assert_frame_equal(three_requests, one_requests)
    assert len(one_requests) > len(one)  # per-request rows came back from the workers


def test_sim_rows_say_so_and_carry_figures_in_simulated_time(tmp_path):
    exp = experiment()
    paths = make_run(tmp_path, exp)
    cells = cell_repeats(exp)
    sim = results.collect_results(
        run_id="r",
        cells=cells,
        raw=[paths.raw(c) for c in cells],
        gpu=[paths.gpu(c) for c in cells],
        engine_kind="sim",
        time_scale=0.005,
    )[0]
    assert set(sim["engine_kind"]) == {"sim"} and set(sim["sim_time_scale"]) == {0.005}
    assert list(sim["simulated_ttft_p50_ms"]) == pytest.approx(list(sim["ttft_p50_ms"] / 0.005))
    assert list(sim["simulated_input_tps"]) == pytest.approx(list(sim["input_tps"] * 0.005))
    real = collect(cells, paths)[0]
    assert set(real["engine_kind"]) == {"sglang"}
    assert real[["sim_time_scale", *results.SIM_COLUMNS]].isna().all().all()


def test_results_csv_floats_have_eight_significant_digits(tmp_path):
    values = [207786.59247074625, 0.023745413335465176, 13.0, math.nan]
    results.write_results_csv(pd.DataFrame({"a": values, "b": "x"}), tmp_path / "r.csv")
    lines = (tmp_path / "r.csv").read_text().splitlines()
    assert lines == ["a,b", "207786.59,x", "0.023745413,x", "13.0,x", ",x"]


def test_results_csv_round_trip(tmp_path):
    exp = experiment()
    paths = make_run(tmp_path, exp)
    df = collect(cell_repeats(exp), paths)[0]
    results.write_results_csv(df, paths.results_csv)
    assert sorted(p.name for p in paths.root.iterdir()) == ["gpu", "raw", "results.csv"]
    back = results.read_results_csv(paths.results_csv)
    pd.testing.assert_frame_equal(back, df, check_dtype=False)
    # Server ids contain commas, so the CSV quotes them.
    second_line = paths.results_csv.read_text().splitlines()[1]
    assert second_line.startswith(
        'moe-prefill-sim,"moe_runner_backend~marlin,chunked_prefill_size~8192",concurrency~8,1,'
    )


def test_missing_raw_file_names_cell_and_file(tmp_path):
    exp = experiment()
    paths = make_run(tmp_path, exp)
    cells = cell_repeats(exp)
    victim = cells[5]
    paths.raw(victim).unlink()
    with pytest.raises(CellFailed) as err:
        collect(cells, paths)[0]
    assert str(paths.raw(victim)) in str(err.value)
    assert victim.key in str(err.value)
    assert "missing" in str(err.value)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ('{"completed": 40, "median_ttft_ms": ', "invalid"),
        ("", "expected exactly one record, found 0"),
        (REC_0523.read_text() * 2, "expected exactly one record, found 2"),
        ('{"completed": "forty"}', "invalid"),
        (json.dumps({**template(REC_0523), "completed": 0}), "completed = 0"),
        (json.dumps({**template(REC_0523), "median_ttft_ms": None}), "missing median_ttft_ms"),
        ('{"a":' * 100_000, "JSON nested too deep"),  # a RecursionError (traceback) before
    ],
)
def test_invalid_raw_file_names_the_file(tmp_path, content, reason):
    exp = experiment()
    paths = make_run(tmp_path, exp)
    cells = cell_repeats(exp)
    paths.raw(cells[0]).write_text(content)
    with pytest.raises(CellFailed, match="is invalid") as err:
        collect(cells, paths)[0]
    assert str(paths.raw(cells[0])) in str(err.value)
    assert reason in str(err.value)


def test_missing_gpu_snapshot_is_reported_not_invented(tmp_path):
    exp = experiment()
    paths = make_run(tmp_path, exp)
    cells = cell_repeats(exp)
    paths.gpu(cells[0]).unlink()
    df = collect(cells, paths)[0]
    assert df["gpu_status"].iloc[0] == "missing"
    assert pd.isna(df["gpu_count"].iloc[0])
    assert math.isnan(df["gpu_power_peak_w"].iloc[0])
    assert df["gpu_status"].iloc[1] == "ok"


def test_requests_csv_round_trips_every_float_exactly(tmp_path):
    exp = experiment()
    paths = make_run(tmp_path, exp)
    cells = cell_repeats(exp)
    n = 5
    details = {
        "ttfts": [0.1 + i / 3 for i in range(n)],
        "itls": [[1 / 7, 2 / 9]] * n,
        "output_lens": [3, 1, 3, 3, 3],
        "errors": ["", "", "x", "", ""],
    }
    write_record(paths.raw(cells[0]), {**template(REC_0523), **details})
    _, table = collect(cells, paths)
    results.write_requests_csv(table, tmp_path / "requests.csv")
    back = results.read_requests_csv(tmp_path / "requests.csv")
    assert len(back) == 4, "the failed request is left out"
    for col in ("ttft_ms", "e2e_ms", "tpot_ms"):
        assert back[col].to_numpy().tobytes() == table[col].to_numpy(dtype=float).tobytes(), col
    assert back["tpot_ms"].isna().sum() == 1, "a one-token output has no TPOT"


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        ({"completed": 39}, "completed 39 of 40 requests"),
        ({"errors": ["HTTP 500: boom"] + [""] * 39}, "HTTP 500: boom"),
    ],
    ids=["completed_39", "error_string"],
)
def test_edited_record_is_rejected_like_the_cell_rejects_it(tmp_path, edit, problem):
    exp = experiment()
    paths = make_run(tmp_path, exp)
    cells = cell_repeats(exp)
    victim = paths.raw(cells[3])
    write_record(victim, {**template(REC_0523), **request_details(40)})
    collect(cells, paths)  # the untouched record passes
    write_record(victim, {**template(REC_0523), **request_details(40), **edit})
    with pytest.raises(CellFailed) as err:
        collect(cells, paths)
    text = str(err.value)
    assert "\n" not in text and problem in text
    assert text.startswith(f"cell {cells[3].key}: raw record {victim} is invalid")
    assert text.endswith(f"delete {victim} to rerun the cell")


def test_gpu_snapshot_cut_before_its_after_rows_is_incomplete(tmp_path):
    exp = experiment()
    paths = make_run(tmp_path, exp)
    cells = cell_repeats(exp)
    gpu = paths.gpu(cells[2])
    lines = gpu.read_text().splitlines(keepends=True)
    gpu.write_text("".join(line for line in lines if ",after," not in line))
    row = collect(cells, paths)[0].iloc[2]
    assert row["gpu_status"] == "incomplete"


@pytest.mark.parametrize(
    "corrupt",
    [b"\xff\xfe\x00garbage", b"node,phase\nlocal,during\n"],
    ids=["bytes", "bad_phase"],
)
def test_corrupt_gpu_snapshot_is_one_line_naming_the_file(tmp_path, corrupt):
    exp = experiment()
    paths = make_run(tmp_path, exp)
    cells = cell_repeats(exp)
    gpu = paths.gpu(cells[2])
    gpu.write_bytes(gpu.read_bytes()[:200] + corrupt)
    with pytest.raises(CellFailed) as err:
        collect(cells, paths)
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(f"cell {cells[2].key}: GPU snapshot {gpu}: ")
    assert text.endswith(f"delete {gpu} to rerun the cell")


# ---------------------------------------------------------------- TPOT and ITL: N/A or flagged

PD_LOCAL = REPO / "config" / "experiments" / "pd_standard_local.yaml"


def builtin_record(workload, *, buffered: bool = False) -> dict:
    """The record the builtin client writes for `workload` (its parser and metrics): one
    `/generate` body per request without streaming, else a chunk per token 30 ms apart, all at
    once if `buffered` (a router that holds the stream back)."""
    done = []
    for i in range(workload.num_requests):
        start, n = 10.0 * i, workload.output_len
        res = RequestResult(
            input_len=workload.input_len, prompt_len=workload.input_len, start_time=start
        )

        def chunk(k: int) -> bytes:
            meta = {"completion_tokens": k, "prompt_tokens": workload.input_len}
            return json.dumps({"text": "w " * k, "meta_info": meta}).encode()

        if workload.stream:
            times = [start + 0.5 + (0.0 if buffered else 0.03 * k) for k in range(n)]
            times.append(times[-1])  # [DONE] right after the last token
            lines = [b"data: " + chunk(k + 1) for k in range(n)] + [b"data: [DONE]"]
        else:
            times, lines = [start + 0.9], [chunk(n)]
        builtin.parse_lines(lines, times, res)
        done.append(res)
    settings = {
        "tag": "t",
        "backend": "sglang",
        "dataset_name": "random-ids",
        "request_rate": math.inf,
        "max_concurrency": workload.concurrency,
        "sharegpt_output_len": None,
        "random_input_len": workload.input_len,
        "random_output_len": workload.output_len,
        "random_range_ratio": 1.0,
    }
    return build_record(
        settings=settings,
        server_info=None,
        accept_length=None,
        duration_s=10.0 * workload.num_requests,
        results=done,
    )


def pd_case_run(tmp_path, records):
    """Seed 003's local PD cells named in `records` (case -> record builder), their raw records
    written (no GPU files): (results table, requests table)."""
    cells = [c for c in cell_repeats(load_experiment_file(PD_LOCAL)) if c.client.id[5:] in records]
    raw = [tmp_path / f"{c.client.id}.jsonl" for c in cells]
    for cell, path in zip(cells, raw, strict=True):
        write_record(path, records[cell.client.id[5:]](cell.workload))
    gpu = [tmp_path / "no-gpu.csv"] * len(cells)
    return results.collect_results(run_id="pd", cells=cells, raw=raw, gpu=gpu)


STREAM_FIGURES = [
    c for c in results.result_columns([], []) if c.startswith(("tpot_", "itl_")) and "_p" in c
]


def test_a_non_streamed_case_has_no_tpot_or_itl_anywhere(tmp_path):
    """Seed 003's `1k-16-c1-nonstream`: TPOT N/A. The client writes 0.0 (its TTFT is the whole
    response's latency); the workload's `stream: false` makes every TPOT/ITL figure blank."""
    df, requests = pd_case_run(
        tmp_path, {"64-8-c1": builtin_record, "1k-16-c1-nonstream": builtin_record}
    )
    raw = read_record(tmp_path / "case~1k-16-c1-nonstream.jsonl")
    assert raw.median_tpot_ms == 0.0 and raw.median_itl_ms == 0.0  # the raw record keeps it
    streamed, unstreamed = df.iloc[0], df.iloc[1]
    assert len(STREAM_FIGURES) == 10  # p50, p95 from the record; p90 ... p99_9 from details
    assert streamed[STREAM_FIGURES].notna().all()
    assert streamed["tpot_p50_ms"] == pytest.approx(30.0)
    assert unstreamed[STREAM_FIGURES].isna().all(), unstreamed[STREAM_FIGURES]
    assert math.isnan(unstreamed["interactivity_tps"])
    assert not streamed["tpot_zero"] and not unstreamed["tpot_zero"]
    assert requests["tpot_ms"].isna().tolist() == [False, True]
    results.write_results_csv(df, tmp_path / "results.csv")
    back = results.read_results_csv(tmp_path / "results.csv")
    assert back.loc[1, STREAM_FIGURES].isna().all()  # empty in the file, never 0
    cells = summary.summarize(
        results=back, baseline={}, server_axes=[], client_axes=["case"], bootstrap=None
    )["cells"]
    tpot = {c["axes"]["case"]: c["metrics"]["tpot_p50_ms"]["median"] for c in cells}
    assert tpot == {"64-8-c1": pytest.approx(30.0), "1k-16-c1-nonstream": None}


def test_a_streamed_tpot_of_zero_is_flagged_and_warned(tmp_path):
    """Every token of a streamed 8-token output arriving at once gives TPOT 0.00: flagged
    (results.csv tpot_zero) and said in the answer's warnings, not reported as a speed."""
    df, _ = pd_case_run(
        tmp_path,
        {
            "64-8-c1": partial(builtin_record, buffered=True),
            "1k-16-c1-nonstream": builtin_record,  # 0.0 too, but undefined: not flagged
            "16k-1-c1": builtin_record,  # one token: no TPOT, not flagged
        },
    )
    assert df["tpot_zero"].tolist() == [True, False, False]
    assert df.loc[0, "tpot_p50_ms"] == 0.0
    said = [w for w in cautions(summary={}, results=df, events=[]) if "TPOT" in w]
    assert said == [
        "TPOT p50 of 0.00 ms in 1 of 3 cell-repeats (pd/case~64-8-c1) that stream outputs of "
        "more than one token: a measurement error (the tokens arrived at once, e.g. through a "
        "buffering router), not a decode speed (tpot_zero in results.csv)."
    ]


def test_tpot_zero_needs_a_streamed_multi_token_workload():
    smoke = load_experiment_file(PD_LOCAL).workload  # 64 -> 8, streamed
    assert results.tpot_zero({"tpot_p50_ms": 0.004}, workload=smoke)
    assert not results.tpot_zero({"tpot_p50_ms": 0.005}, workload=smoke)
    assert not results.tpot_zero({"tpot_p50_ms": math.nan}, workload=smoke)
    assert not results.tpot_zero(
        {"tpot_p50_ms": 0.0}, workload=smoke.model_copy(update={"stream": False})
    )
    assert not results.tpot_zero(
        {"tpot_p50_ms": 0.0}, workload=smoke.model_copy(update={"output_len": 1})
    )


def test_record_metrics_blank_tpot_and_itl_of_a_record_that_did_not_stream():
    raw = template(REC_BUILTIN)  # a streamed record: TPOT 11.9 ms
    assert results.record_metrics(raw)["tpot_p50_ms"] == pytest.approx(raw["median_tpot_ms"])
    m = results.record_metrics(raw, stream=False)
    assert all(math.isnan(m[c]) for c in results.TOKEN_TIMING)
    assert m["ttft_p50_ms"] == pytest.approx(raw["median_ttft_ms"])  # the rest is kept
    assert results.TOKEN_TIMING == ("tpot_p50_ms", "tpot_p95_ms", "itl_p50_ms")
