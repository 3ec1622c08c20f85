"""Tests of servesweep.analysis: records -> results.csv -> summary.json, on the default matrix."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest

from servesweep import analysis, telemetry
from servesweep.config import RunPaths, cell_repeats, load_experiment_file
from servesweep.errors import CellFailed
from servesweep.records import BenchRecord, read_record, write_record

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
CONFIG = REPO / "config" / "config.yaml"
REC_0523 = DATA / "records" / "bench_serving-0.5.23.jsonl"
REC_059 = DATA / "records" / "bench_serving-0.5.9.jsonl"
REC_BUILTIN = DATA / "records" / "builtin.jsonl"

# Multiplicative effects on latencies (throughputs are divided by them).
CHUNK = {8192: 1.0, 16384: 1.05}
CONC = {8: 1.0, 16: 1.8}
REPEAT = {1: 1.0, 2: 1.02, 3: 0.98}  # median factor over repeats is exactly 1
THROUGHPUTS = ("request_throughput", "input_throughput", "output_throughput", "total_throughput")


def template(path: Path) -> dict:
    return json.loads(path.read_text())


def experiment(**env: str):
    return load_experiment_file(CONFIG, env)


def cell_record(cell, base: dict, backend: dict[str, float]) -> dict:
    s, c = cell.server.axes, cell.client.axes
    f = backend[s["moe_runner_backend"]] * CHUNK[s["chunked_prefill_size"]]
    f *= CONC[c["concurrency"]] * REPEAT[cell.repeat]
    rec = dict(base)
    for key, value in base.items():
        if key.endswith("_ms") and value is not None:
            rec[key] = value * f
        elif key in THROUGHPUTS:
            rec[key] = value / f
    rec["max_concurrency"] = c["concurrency"]
    return rec


def gpu_snapshot() -> list[dict]:
    idle = telemetry.parse_noheader(
        (DATA / "nvidia-smi-8gpu" / "query-idle-8gpu-noheader-nounits.csv").read_text()
    )
    load = telemetry.parse_noheader(
        (DATA / "nvidia-smi-8gpu" / "query-load-8gpu-noheader-nounits.csv").read_text()
    )
    meta = {"node": "local", "status": "ok", "detail": ""}
    return [{**row, **meta, "phase": "before"} for row in idle] + [
        {**row, **meta, "phase": "after"} for row in load
    ]


def make_run(root: Path, exp, *, base: Path = REC_0523, backend=None) -> RunPaths:
    backend = backend or {"marlin": 1.0, "flashinfer_mxfp4": 0.9}
    paths = RunPaths.for_run(exp, root / "results")
    snapshot = gpu_snapshot()
    rec = template(base)
    for cell in cell_repeats(exp):
        write_record(paths.raw(cell), cell_record(cell, rec, backend))
        telemetry.write_snapshot(paths.gpu(cell), snapshot)
    return paths


def summary_of(exp, results: pd.DataFrame, **kw) -> dict:
    return analysis.summarize(
        results=results,
        baseline=kw.get("baseline", exp.baseline),
        server_axes=list(exp.matrix.server),
        client_axes=list(exp.matrix.client),
    )


# ---------------------------------------------------------------- record_metrics


def test_record_metrics_of_bench_serving_0523():
    raw = template(REC_0523)
    m = analysis.record_metrics(read_record(REC_0523))
    assert list(m) == list(analysis.METRICS)
    for column, key in analysis.METRICS.items():
        assert m[column] == pytest.approx(raw[key]), column
    assert m["ttft_p50_ms"] == raw["median_ttft_ms"]
    assert m["input_tps"] == raw["input_throughput"]
    assert m["completed"] == 40 and isinstance(m["completed"], int)
    assert m["total_input_tokens"] == 40 * 16384
    assert m["tpot_p50_ms"] == 0.0  # bench_serving reports 0 when every output is 1 token


def test_record_metrics_of_bench_serving_059_lacks_p95():
    m = analysis.record_metrics(template(REC_059))  # a plain dict works too
    assert math.isnan(m["ttft_p95_ms"])
    assert math.isnan(m["tpot_p95_ms"])
    assert m["ttft_p99_ms"] == template(REC_059)["p99_ttft_ms"]
    assert analysis.check_record(template(REC_059)) == []


def test_record_metrics_of_builtin_client():
    m = analysis.record_metrics(BenchRecord.model_validate(template(REC_BUILTIN)))
    assert m["tpot_p50_ms"] == pytest.approx(template(REC_BUILTIN)["median_tpot_ms"])
    assert m["tpot_p50_ms"] > 5
    assert m["total_output_tokens"] == 24 * 128


def test_record_metrics_missing_and_bad_values():
    m = analysis.record_metrics({"median_ttft_ms": 12.5, "completed": 3})
    assert m["ttft_p50_ms"] == 12.5
    assert m["completed"] == 3
    assert math.isnan(m["input_tps"])
    assert analysis.check_record({"median_ttft_ms": 12.5, "completed": 3})  # not analysable
    with pytest.raises(ValueError, match="median_ttft_ms"):
        analysis.record_metrics({"median_ttft_ms": "fast"})


# ---------------------------------------------------------------- collect_results


def test_collect_results_default_matrix(tmp_path):
    exp = experiment()
    paths = make_run(tmp_path, exp)
    cells = cell_repeats(exp)
    df = analysis.collect_results(cells=cells, paths=paths)
    assert len(df) == 24
    assert list(df.columns) == [
        "run_id",
        "server_id",
        "client_id",
        "repeat",
        "fingerprint",
        "moe_runner_backend",
        "chunked_prefill_size",
        "concurrency",
        *analysis.METRICS,
        *telemetry.GPU_FIGURES,
    ]
    assert set(df["run_id"]) == {"moe-prefill-sim"}
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


def test_results_csv_round_trip(tmp_path):
    exp = experiment()
    paths = make_run(tmp_path, exp)
    df = analysis.collect_results(cells=cell_repeats(exp), paths=paths)
    analysis.write_results_csv(df, paths.results_csv)
    assert sorted(p.name for p in paths.root.iterdir()) == ["gpu", "raw", "results.csv"]
    back = analysis.read_results_csv(paths.results_csv)
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
        analysis.collect_results(cells=cells, paths=paths)
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
    ],
)
def test_invalid_raw_file_names_the_file(tmp_path, content, reason):
    exp = experiment()
    paths = make_run(tmp_path, exp)
    cells = cell_repeats(exp)
    paths.raw(cells[0]).write_text(content)
    with pytest.raises(CellFailed, match="is invalid") as err:
        analysis.collect_results(cells=cells, paths=paths)
    assert str(paths.raw(cells[0])) in str(err.value)
    assert reason in str(err.value)


def test_missing_gpu_snapshot_is_reported_not_invented(tmp_path):
    exp = experiment()
    paths = make_run(tmp_path, exp)
    cells = cell_repeats(exp)
    paths.gpu(cells[0]).unlink()
    df = analysis.collect_results(cells=cells, paths=paths)
    assert df["gpu_status"].iloc[0] == "missing"
    assert pd.isna(df["gpu_count"].iloc[0])
    assert math.isnan(df["gpu_power_peak_w"].iloc[0])
    assert df["gpu_status"].iloc[1] == "ok"


# ---------------------------------------------------------------- summarize


@pytest.fixture(scope="module")
def default_results(tmp_path_factory):
    exp = experiment()
    paths = make_run(tmp_path_factory.mktemp("run"), exp)
    return exp, analysis.collect_results(cells=cell_repeats(exp), paths=paths)


def test_summary_cells(default_results):
    exp, df = default_results
    before = df.copy()
    s = summary_of(exp, df)
    pd.testing.assert_frame_equal(df, before)  # pure
    assert s["run_id"] == "moe-prefill-sim"
    assert s["baseline"] == {"moe_runner_backend": "marlin"}
    assert s["server_axes"] == ["moe_runner_backend", "chunked_prefill_size"]
    assert s["client_axes"] == ["concurrency"]
    assert len(s["cells"]) == 8
    assert all(c["n"] == 3 for c in s["cells"])
    first = s["cells"][0]
    assert first["axes"] == {
        "moe_runner_backend": "marlin",
        "chunked_prefill_size": 8192,
        "concurrency": 8,
    }
    assert first["server_id"] == "moe_runner_backend~marlin,chunked_prefill_size~8192"
    # Output length 1: TPOT is meaningless and left out.
    assert list(first["metrics"]) == [
        "ttft_p50_ms",
        "ttft_p95_ms",
        "ttft_p99_ms",
        "e2e_p50_ms",
        "input_tps",
    ]
    ttft = template(REC_0523)["median_ttft_ms"]
    # 3 repeats, no per-request details: the 95% interval of the median is [min, max].
    assert first["metrics"]["ttft_p50_ms"] == {
        "median": pytest.approx(ttft),
        "min": pytest.approx(ttft * 0.98),
        "max": pytest.approx(ttft * 1.02),
        "ci_low": pytest.approx(ttft * 0.98),
        "ci_high": pytest.approx(ttft * 1.02),
        "resampled": "repeats",
    }
    assert first["repeat_resamples"] == 10 and first["coarse"] is True
    assert s["method"]["repeats"] == {
        "3": {"cells": 8, "distinct_repeat_resamples": 10, "coarse": True}
    }
    assert s["metrics"]["input_tps"] == {"better": "higher"}
    assert s["metrics"]["ttft_p99_ms"] == {"better": "lower"}


def test_summary_deltas_vs_baseline(default_results):
    exp, df = default_results
    s = summary_of(exp, df)
    assert s["note"] is None
    assert len(s["deltas"]) == 4
    labels = [d["label"] for d in s["deltas"]]
    assert (
        labels[0] == "moe_runner_backend=flashinfer_mxfp4, chunked_prefill_size=8192, concurrency=8"
    )
    for d in s["deltas"]:
        assert d["axes"]["moe_runner_backend"] == "flashinfer_mxfp4"
        assert d["baseline_axes"] == {**d["axes"], "moe_runner_backend": "marlin"}
        assert (d["n_candidate"], d["n_baseline"]) == (3, 3)
        ttft = d["metrics"]["ttft_p50_ms"]
        assert ttft["delta_pct"] == pytest.approx(-10.0)
        assert ttft["delta_abs"] == pytest.approx(
            ttft["candidate_median"] - ttft["baseline_median"]
        )
        assert ttft["better"] is True
        tps = d["metrics"]["input_tps"]
        assert tps["delta_pct"] == pytest.approx(100 / 9)
        assert tps["better"] is True


def test_worse_candidate_and_client_axis_baseline(default_results):
    exp, df = default_results
    s = summary_of(exp, df, baseline={"concurrency": 8})
    assert len(s["deltas"]) == 4
    for d in s["deltas"]:
        assert d["axes"]["concurrency"] == 16
        assert d["metrics"]["ttft_p50_ms"]["delta_pct"] == pytest.approx(80.0)
        assert d["metrics"]["ttft_p50_ms"]["better"] is False
        assert d["metrics"]["input_tps"]["better"] is False


def test_tpot_is_summarized_when_requests_produce_tokens(tmp_path):
    exp = experiment()
    paths = make_run(tmp_path, exp, base=REC_BUILTIN)
    df = analysis.collect_results(cells=cell_repeats(exp), paths=paths)
    s = summary_of(exp, df)
    assert "tpot_p50_ms" in s["cells"][0]["metrics"]
    assert s["deltas"][0]["metrics"]["tpot_p50_ms"]["delta_pct"] == pytest.approx(-10.0)


def test_summary_of_old_records_without_p95(tmp_path):
    exp = experiment()
    paths = make_run(tmp_path, exp, base=REC_059)
    df = analysis.collect_results(cells=cell_repeats(exp), paths=paths)
    s = summary_of(exp, df)
    assert s["cells"][0]["metrics"]["ttft_p95_ms"] == {
        "median": None,
        "min": None,
        "max": None,
        "ci_low": None,
        "ci_high": None,
        "resampled": None,
    }
    p95 = s["deltas"][0]["metrics"]["ttft_p95_ms"]
    assert p95["delta_pct"] is None and p95["better"] is None
    assert p95["ci_low"] is None and p95["verdict"] == "unknown"
    analysis.write_summary(s, tmp_path / "summary.json")
    assert analysis.read_summary(tmp_path / "summary.json") == json.loads(json.dumps(s))


def test_narrowed_matrix_without_baseline(tmp_path):
    exp = experiment(BACKENDS_CSV="flashinfer_mxfp4")
    assert exp.baseline == {}
    paths = make_run(tmp_path, exp)
    df = analysis.collect_results(cells=cell_repeats(exp), paths=paths)
    s = summary_of(exp, df)
    assert len(s["cells"]) == 4
    assert s["deltas"] == []
    assert "no baseline in this run" in s["note"]


def test_one_cell_matrix_of_the_baseline(tmp_path):
    exp = experiment(
        BACKENDS_CSV="marlin", CHUNKED_PREFILL_SIZES_CSV="8192", CONCURRENCIES_CSV="16"
    )
    paths = make_run(tmp_path, exp)
    df = analysis.collect_results(cells=cell_repeats(exp), paths=paths)
    s = summary_of(exp, df)
    assert [c["n"] for c in s["cells"]] == [3]
    assert s["deltas"] == []
    assert s["note"] == "only the baseline moe_runner_backend=marlin ran: no other value to compare"


def test_baseline_on_an_axis_the_run_lacks(default_results):
    exp, df = default_results
    s = summary_of(exp, df, baseline={"page_size": 64})
    assert s["deltas"] == []
    assert s["note"] == "baseline axis page_size is not an axis of this run"
    with pytest.raises(ValueError, match="tp_size"):
        analysis.summarize(results=df, baseline={}, server_axes=["tp_size"], client_axes=[])


def test_write_summary_is_strict_json(tmp_path, default_results):
    exp, df = default_results
    s = summary_of(exp, df)
    s["cells"][0]["metrics"]["ttft_p50_ms"]["median"] = float("nan")  # as a later stage might
    path = tmp_path / "out" / "summary.json"
    analysis.write_summary(s, path)
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    back = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert back["cells"][0]["metrics"]["ttft_p50_ms"]["median"] is None
    assert back["deltas"][0]["metrics"]["ttft_p50_ms"]["delta_pct"] == pytest.approx(-10.0)


def test_summary_is_the_same_after_the_csv_round_trip(tmp_path, default_results):
    exp, df = default_results
    analysis.write_results_csv(df, tmp_path / "results.csv")
    back = analysis.read_results_csv(tmp_path / "results.csv")
    assert summary_of(exp, back) == summary_of(exp, df)


def test_summary_parts_of_grouped_rows_match_the_summary(default_results):
    exp, df = default_results
    s = summary_of(exp, df)
    groups = analysis.group_cells(df, [*exp.matrix.server, *exp.matrix.client])
    assert [ax for ax, _ in groups] == [c["axes"] for c in s["cells"]]
    assert analysis.summarize_cells(groups) == s["cells"]
    assert analysis.baseline_deltas(groups, baseline=exp.baseline) == (s["deltas"], None)


def test_each_stage_reads_only_the_record_keys_it_needs(tmp_path):
    exp = experiment()
    paths = make_run(tmp_path, exp)
    cells = cell_repeats(exp)
    n = 40
    details = {"ttfts": [0.5] * n, "itls": [[]] * n, "output_lens": [1] * n, "errors": [""] * n}
    write_record(paths.raw(cells[0]), {**template(REC_0523), **details})
    # Details that do not validate: results.csv does not read them, the bootstrap cannot.
    broken = json.dumps({**template(REC_0523), **details, "itls": "garbage"})
    paths.raw(cells[1]).write_text(broken + "\n")
    df = analysis.collect_results(cells=cells, paths=paths)
    assert len(df) == 24
    reqs = analysis.load_requests(results=df.iloc[:2], run_dir=paths.root)
    first, second = ((c.server.id, c.client.id, c.repeat) for c in cells[:2])
    assert reqs[first].ttft == pytest.approx([500.0] * n)
    assert reqs[second] is None


def test_empty_run():
    exp = experiment()
    df = analysis.collect_results(cells=[], paths=RunPaths(Path("/nonexistent/run")))
    assert len(df) == 0
    s = summary_of(exp, df)
    assert s["cells"] == [] and s["deltas"] == []
    assert s["note"] == "no results in this run"
