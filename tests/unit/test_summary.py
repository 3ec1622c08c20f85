"""Tests of servesweep.analysis.summary: results.csv -> summary.json, on the default matrix."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from servesweep.analysis import summary
from servesweep.analysis.results import read_results_csv, write_results_csv
from servesweep.config.matrix import cell_repeats
from servesweep.config.paths import RunPaths
from servesweep.core import parallel
from servesweep.core.errors import CellFailed
from servesweep.measure.records import write_record
from tests.support.runs import (
    REC_0523,
    REC_059,
    REC_BUILTIN,
    collect,
    detailed_template,
    experiment,
    make_run,
    template,
)


def summary_of(exp, results: pd.DataFrame, **kw) -> dict:
    return summary.summarize(
        results=results,
        baseline=kw.get("baseline", exp.baseline),
        server_axes=list(exp.matrix.server),
        client_axes=list(exp.matrix.client),
        requests=kw.get("requests"),
        workers=kw.get("workers", 1),
    )


# ---------------------------------------------------------------- summarize


@pytest.fixture(scope="module")
def default_results(tmp_path_factory):
    exp = experiment()
    paths = make_run(tmp_path_factory.mktemp("run"), exp)
    return exp, collect(cell_repeats(exp), paths)[0]


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
    # Output length 1: TPOT, ITL and output-token rates are meaningless and left out.
    assert list(first["metrics"]) == [
        "ttft_p50_ms",
        "ttft_p95_ms",
        "ttft_p99_ms",
        "e2e_p50_ms",
        "input_tps",
        "e2e_p99_ms",
        "concurrency_mean",
        "input_tps_per_gpu",
    ]  # no GPU samples, no SLO, no per-request details here
    assert list(first["metrics"])[:5] == [
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
    exp = experiment(workload_of=REC_BUILTIN)
    paths = make_run(tmp_path, exp, base=REC_BUILTIN)
    df = collect(cell_repeats(exp), paths)[0]
    s = summary_of(exp, df)
    assert "tpot_p50_ms" in s["cells"][0]["metrics"]
    assert s["deltas"][0]["metrics"]["tpot_p50_ms"]["delta_pct"] == pytest.approx(-10.0)


def test_cells_resampled_in_worker_processes_give_the_same_summary(tmp_path, monkeypatch):
    monkeypatch.setattr(parallel, "MIN_PER_WORKER", 1)  # 8 cells: fork anyway
    exp = experiment()
    paths = make_run(tmp_path / "run", exp, base=detailed_template(tmp_path))
    df, requests_df = collect(cell_repeats(exp), paths)
    requests = summary.load_requests(results=df, requests=requests_df)
    one = summary_of(exp, df, requests=requests)
    three = summary_of(exp, df, requests=requests, workers=3)
    assert json.dumps(three) == json.dumps(one)
    assert one["method"]["resampled"]["ttft_p99_ms"] == "repeats+requests"
    assert len(one["deltas"]) == 4 and all(
        "ci_low" in c["metrics"]["ttft_p99_ms"] for c in one["cells"]
    )


def test_summary_of_old_records_without_p95(tmp_path):
    exp = experiment()
    paths = make_run(tmp_path, exp, base=REC_059)
    df = collect(cell_repeats(exp), paths)[0]
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
    summary.write_summary(s, tmp_path / "summary.json")
    assert summary.read_summary(tmp_path / "summary.json") == json.loads(json.dumps(s))


def test_narrowed_matrix_without_baseline(tmp_path):
    exp = experiment(BACKENDS_CSV="flashinfer_mxfp4")
    assert exp.baseline == {}
    paths = make_run(tmp_path, exp)
    df = collect(cell_repeats(exp), paths)[0]
    s = summary_of(exp, df)
    assert len(s["cells"]) == 4
    assert s["deltas"] == []
    assert "no baseline in this run" in s["note"]


def test_one_cell_matrix_of_the_baseline(tmp_path):
    exp = experiment(
        BACKENDS_CSV="marlin", CHUNKED_PREFILL_SIZES_CSV="8192", CONCURRENCIES_CSV="16"
    )
    paths = make_run(tmp_path, exp)
    df = collect(cell_repeats(exp), paths)[0]
    s = summary_of(exp, df)
    assert [c["n"] for c in s["cells"]] == [3]
    assert s["deltas"] == []
    assert s["note"] == "only the baseline moe_runner_backend=marlin ran: no other value to compare"


def test_baseline_on_an_axis_the_run_lacks(default_results):
    exp, df = default_results
    s = summary_of(exp, df, baseline={"page_size": 64})
    assert s["deltas"] == []
    assert s["note"] == "baseline axis page_size is not an axis of this run"
    with pytest.raises(ValueError, match="page_size"):
        summary.summarize(results=df, baseline={}, server_axes=["page_size"], client_axes=[])


def test_write_summary_is_strict_json(tmp_path, default_results):
    exp, df = default_results
    s = summary_of(exp, df)
    s["cells"][0]["metrics"]["ttft_p50_ms"]["median"] = float("nan")  # as a later stage might
    path = tmp_path / "out" / "summary.json"
    summary.write_summary(s, path)
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    back = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert back["cells"][0]["metrics"]["ttft_p50_ms"]["median"] is None
    assert back["deltas"][0]["metrics"]["ttft_p50_ms"]["delta_pct"] == pytest.approx(-10.0)


def test_summary_is_the_same_after_the_csv_round_trip(tmp_path, default_results):
    exp, df = default_results
    write_results_csv(df, tmp_path / "results.csv")
    back = read_results_csv(tmp_path / "results.csv")
    assert summary_of(exp, back) == summary_of(exp, df)


def test_summary_parts_of_grouped_rows_match_the_summary(default_results):
    exp, df = default_results
    s = summary_of(exp, df)
    groups = summary.group_cells(df, [*exp.matrix.server, *exp.matrix.client])
    assert [ax for ax, _ in groups] == [c["axes"] for c in s["cells"]]
    assert summary.summarize_cells(groups) == s["cells"]
    assert summary.baseline_deltas(groups, baseline=exp.baseline) == (s["deltas"], None)


def test_each_stage_reads_only_the_record_keys_it_needs(tmp_path):
    exp = experiment()
    paths = make_run(tmp_path, exp)
    cells = cell_repeats(exp)
    n = 40
    ttft_ms = template(REC_0523)["median_ttft_ms"]  # details agree with the summary figures
    ttfts = [ttft_ms / 1000] * n
    details = {"ttfts": ttfts, "itls": [[]] * n, "output_lens": [1] * n, "errors": [""] * n}
    write_record(paths.raw(cells[0]), {**template(REC_0523), **details})
    df, table = collect(cells, paths)
    assert len(df) == 24
    reqs = summary.load_requests(results=df.iloc[:2], requests=table)
    first, second = ((c.server.id, c.client.id, c.repeat) for c in cells[:2])
    assert reqs[first].ttft == pytest.approx([ttft_ms] * n)
    assert reqs[second] is None  # no details: the bootstrap falls back to repeats
    # Details that do not validate: the cell's check rejects the record, so does collect.
    broken = json.dumps({**template(REC_0523), **details, "itls": "garbage"})
    paths.raw(cells[1]).write_text(broken + "\n")
    with pytest.raises(CellFailed, match=f"delete {paths.raw(cells[1])} to rerun the cell"):
        collect(cells, paths)


def test_empty_run():
    exp = experiment()
    df = collect([], RunPaths(Path("/nonexistent/run")))[0]
    assert len(df) == 0
    s = summary_of(exp, df)
    assert s["cells"] == [] and s["deltas"] == []
    assert s["note"] == "no results in this run"
