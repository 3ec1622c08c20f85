"""`servesweep import`: real corpus records and a seed-style raw/ folder as runs that compare."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from servesweep.analysis import compare
from servesweep.analysis.results import (
    DERIVED,
    FIGURE_COLUMNS,
    GPU_COLUMNS,
    HYGIENE_COLUMNS,
    METRICS,
    SIM_COLUMNS,
    START_COLUMNS,
)
from servesweep.measure import servermetrics
from servesweep.workflow.cli import main
from tests.helpers import REPO
from tests.unit.test_compare import MARLIN, MATRIX_A, detailed_record, write_run

REAL = REPO / "tests" / "fixtures" / "real" / "records"

SEED_MAPPING = """\
files: "raw/*.jsonl"
server:
  moe_runner_backend: '^raw/(marlin|flashinfer_mxfp4)_'
  chunked_prefill_size: '_chunk(\\d+)_'
client:
  concurrency: '_c(\\d+)_'
repeat: '_r(\\d+)\\.jsonl$'
baseline:
  moe_runner_backend: marlin
"""


def seed_raw_folder(root: Path, *, seed: int = 3) -> Path:
    """A bash-orchestrator raw/ folder (one record per repeat, axes in the file name), with
    one silent failure among the files."""
    rng = np.random.default_rng(seed)
    raw = root / "raw"
    raw.mkdir(parents=True)
    for backend, scale in (("marlin", 1.0), ("flashinfer_mxfp4", 0.8)):
        for repeat in (1, 2, 3):
            rec = detailed_record(rng, scale=scale)
            rec["total_output_tokens_retokenized"] = 39  # one empty special-token text
            name = f"{backend}_chunk8192_c8_r{repeat}.jsonl"
            (raw / name).write_text(json.dumps({**rec, "request_rate": float("inf")}) + "\n")
    broken = detailed_record(rng, scale=1.0)
    broken.update(total_output_tokens_retokenized=0, ttfts=[0.0] * 40)
    (raw / "marlin_chunk8192_c16_r1.jsonl").write_text(json.dumps(broken) + "\n")
    return root


def test_real_records_import_with_a_record_field_axis(tmp_path, capsys):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("datacrunch-llama-405b-online.jsonl", "issue12389-ifb-retokenized-zero.jsonl"):
        shutil.copy(REAL / name, src / name)
    mapping = tmp_path / "map.yaml"
    mapping.write_text("client:\n  request_rate: {record: request_rate}\n")
    argv = ["import", str(src), "--run-id", "real", "--mapping", str(mapping)]
    rc = main([*argv, "--results", str(tmp_path / "results"), "--no-plots"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 1  # one record refused
    assert out[0].startswith("rejected issue12389-ifb-retokenized-zero.jsonl: invalid: ")
    assert out[-1].endswith(
        "imported 6 record(s) into " + str(tmp_path / "results" / "real") + " (1 rejected)"
    )
    df = pd.read_csv(tmp_path / "results" / "real" / "results.csv")
    lines = (REAL / "datacrunch-llama-405b-online.jsonl").read_text().splitlines()
    assert sorted(df["request_rate"]) == sorted(json.loads(x)["request_rate"] for x in lines)
    assert df.groupby("client_id")["repeat"].max().max() == 2  # same rate twice: repeats 1, 2
    derived = list(df.columns).index(DERIVED[-1])
    assert list(df.columns[derived + 1 :]) == [
        *GPU_COLUMNS,
        *FIGURE_COLUMNS,
        *HYGIENE_COLUMNS,
        *START_COLUMNS,
        *servermetrics.COLUMNS,
        *SIM_COLUMNS,
    ]
    assert set(df["engine_kind"]) == {"sglang"}
    for raw in (tmp_path / "results" / "real" / "raw").rglob("*.jsonl"):  # strict JSON copies
        json.loads(raw.read_text(), parse_constant=pytest.fail)
    assert df["retokenized_ratio"].between(0.98, 1).all() and (df["retokenized_ratio"] < 1).all()
    assert all(c in df.columns for c in METRICS)
    assert df[["client_process_cpu_pct", "client_saturated"]].isna().all().all()  # no figures
    summary = json.loads((tmp_path / "results" / "real" / "summary.json").read_text())
    assert summary["imported"]["records"] == 6 and len(summary["imported"]["rejected"]) == 1


def test_seed_folder_imports_and_compares_with_a_workflow_run(tmp_path, capsys):
    write_run(tmp_path, "A", MATRIX_A, lambda _: 1.0, seed=1)  # the workflow's layout
    folder = seed_raw_folder(tmp_path / "bash-run")
    mapping = tmp_path / "seed.yaml"
    mapping.write_text(SEED_MAPPING)
    results = tmp_path / "results"
    rc = main(
        [
            "import",
            str(folder),
            "--run-id",
            "bash",
            "--mapping",
            str(mapping),
            "--results",
            str(results),
        ]
    )
    out = capsys.readouterr().out
    assert rc == 1
    assert "rejected raw/marlin_chunk8192_c16_r1.jsonl: invalid: 40 request(s) with ttft 0" in out
    run = results / "bash"
    assert (run / "raw" / MARLIN / "concurrency~8" / "r3.jsonl").exists()
    assert (run / "plots" / "delta_ttft_p50_ms.png").stat().st_size > 0
    assert (run / "plots" / "ttft_p50_ms_vs_concurrency.png").exists()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["baseline"] == {"moe_runner_backend": "marlin"}
    # the comparison the compare_runs rule makes (rules/compare.smk -> jobs.compare_runs)
    results_a, requests_a = compare.load_run(
        results_csv=results / "A" / "results.csv", requests_csv=None
    )
    results_b, requests_b = compare.load_run(
        results_csv=run / "results.csv", requests_csv=run / "requests.csv"
    )
    assert all(v is not None for v in requests_b.values())  # per-request details came along
    comparison = compare.compare_runs(
        results_a=results_a,
        results_b=results_b,
        run_a="A",
        run_b="bash",
        requests_a=requests_a,
        requests_b=requests_b,
    )
    cells = {(c["server_id"], c["client_id"]) for c in comparison["cells"]}
    assert (MARLIN, "concurrency~8") in cells and len(cells) == 2


def test_mapping_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "m.yaml"
    bad.write_text("server:\n  x: '(a)(b)'\n")
    assert main(["import", str(tmp_path), "--run-id", "x", "--mapping", str(bad)]) == 2
    assert "mapping key 'server'" in capsys.readouterr().err
    bad.write_text("servers: {}\n")
    assert main(["import", str(tmp_path), "--run-id", "x", "--mapping", str(bad)]) == 2
    assert "mapping key 'servers'" in capsys.readouterr().err


@pytest.mark.parametrize("run_id", ["../x", "a b"])
def test_bad_run_id(tmp_path, run_id, capsys):
    assert main(["import", str(tmp_path), "--run-id", run_id]) == 2


def test_an_axis_read_from_a_record_never_writes_outside_the_run(tmp_path, capsys):
    """A record whose `backend` is a path (`../..`, another run's raw folder) is refused: an id
    read from data is one folder name, so no file lands outside results/<run>/."""
    src = tmp_path / "src"
    src.mkdir()
    line = (REAL / "datacrunch-llama-405b-online.jsonl").read_text().splitlines()[0]
    good, forged = json.loads(line), json.loads(line)
    good["backend"], forged["backend"] = "sglang", "../../../../outside/x"
    (src / "a.jsonl").write_text(json.dumps(good) + "\n" + json.dumps(forged) + "\n")
    mapping = tmp_path / "map.yaml"
    mapping.write_text(
        "server:\n  backend: {record: backend}\nclient:\n  rate: {record: request_rate}\n"
    )
    results = tmp_path / "work" / "results"
    argv = ["import", str(src), "--run-id", "imp", "--mapping", str(mapping)]
    rc = main([*argv, "--results", str(results), "--no-plots"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "rejected a.jsonl:2: unreadable: server id 'backend~../../../../outside/x'" in out
    written = {p for p in tmp_path.rglob("*") if p.is_file()} - set(src.iterdir()) - {mapping}
    assert written and all(p.is_relative_to(results / "imp") for p in written), written


def test_import_without_mapping_warns_of_files_merged_into_one_cell(tmp_path, capsys):
    """Four files of four configurations (one backend per folder), same concurrency: without
    --mapping they are one cell's repeats; the import says so with the count (issue 27)."""
    src = tmp_path / "src"
    line = (REAL / "h200-rehearsal-0517-bench-serving.jsonl").read_text().splitlines()[0]
    for backend in ("marlin", "triton", "cutlass", "flashinfer_mxfp4"):
        (src / backend).mkdir(parents=True)
        (src / backend / "run.jsonl").write_text(line + "\n")
    argv = ["import", str(src), "--run-id", "merged", "--results", str(tmp_path / "results")]
    assert main([*argv, "--no-plots"]) == 0
    out = capsys.readouterr().out.splitlines()
    warned = [x for x in out if "treated as repeats of one cell" in x]
    concurrency = json.loads(line)["max_concurrency"]
    assert len(warned) == 1, out
    assert warned[0].startswith(
        f"warning cell default/concurrency~{concurrency}: 4 files treated as repeats of one cell "
        "(cutlass/run.jsonl, flashinfer_mxfp4/run.jsonl, marlin/run.jsonl, ...;"
    ), warned
    assert "--mapping" in warned[0]


def test_import_never_writes_over_a_measured_record_of_an_unfinished_run(tmp_path, capsys):
    """An interrupted (or running) run has raw records and no results.csv yet: importing under
    its id is refused, and its record stays byte for byte."""
    src = seed_raw_folder(tmp_path / "src")
    mapping = tmp_path / "map.yaml"
    mapping.write_text(SEED_MAPPING)
    run = tmp_path / "results" / "live"
    measured = run / "raw" / "moe_runner_backend~marlin,chunked_prefill_size~8192" / "concurrency~8"
    measured.mkdir(parents=True)
    record = measured / "r1.jsonl"
    record.write_text('{"measured": "by the workflow"}\n')
    argv = ["import", str(src), "--run-id", "live", "--mapping", str(mapping)]
    rc = main([*argv, "--results", str(tmp_path / "results"), "--no-plots"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "already holds a run" in err and "r1.jsonl" in err and "another --run-id" in err
    assert record.read_text() == '{"measured": "by the workflow"}\n'
    assert not (run / "results.csv").exists()


def test_import_refuses_figures_the_records_own_arrays_contradict(tmp_path, capsys):
    """The real H200 record imports; with its p99 TTFT raised, its E2E median lowered or its
    arrays cut by one request (completed still 96), each copy is refused with the figure named
    and nothing of it is written."""
    line = (REAL / "h200-rehearsal-0517-bench-serving.jsonl").read_text().splitlines()[0]
    good = json.loads(line)
    cut = {k: v[:-1] if isinstance(v, list) else v for k, v in good.items()}
    forged = {
        "p99.jsonl": {**good, "p99_ttft_ms": good["p99_ttft_ms"] * 1.1},
        "e2e.jsonl": {**good, "median_e2e_latency_ms": good["median_e2e_latency_ms"] * 0.9},
        "cut.jsonl": cut,
    }
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.jsonl").write_text(line + "\n")
    for name, record in forged.items():
        (src / name).write_text(json.dumps(record) + "\n")
    mapping = tmp_path / "map.yaml"
    mapping.write_text("server:\n  name: '^(\\w+)\\.jsonl$'\n")
    argv = ["import", str(src), "--run-id", "imp", "--mapping", str(mapping), "--no-plots"]
    rc = main([*argv, "--results", str(tmp_path / "results")])
    out = capsys.readouterr().out
    assert rc == 1, out
    rejected = {
        x.split(":")[0].split()[-1]: x for x in out.splitlines() if x.startswith("rejected ")
    }
    assert sorted(rejected) == sorted(forged), out
    assert "p99_ttft_ms" in rejected["p99.jsonl"]
    assert "median_e2e_latency_ms" in rejected["e2e.jsonl"]
    assert "completed 96 contradicts the requests without an error: 95" in rejected["cut.jsonl"]
    df = pd.read_csv(tmp_path / "results" / "imp" / "results.csv")
    assert list(df["server_id"]) == ["name~good"]
