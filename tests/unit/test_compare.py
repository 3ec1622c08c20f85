"""Tests of analysis.compare on two synthetic runs with per-request details, and the rule."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from servesweep.analysis import compare, plots
from servesweep.analysis.results import (
    collect_results,
    read_requests_csv,
    write_requests_csv,
    write_results_csv,
)
from servesweep.analysis.summary import summarize
from servesweep.cluster import telemetry
from servesweep.config.load import load_experiment_file
from servesweep.config.matrix import CellRepeat, cell_repeats
from servesweep.config.paths import RunPaths
from servesweep.core import gpufile
from servesweep.measure.records import write_record
from tests.helpers import REPO, experiment_file

DATA = REPO / "tests" / "data"
SERVER_AXES = {"moe_runner_backend": ["marlin", "flashinfer_mxfp4"], "chunked_prefill_size": [8192]}
MATRIX_A = {"matrix": {"server": SERVER_AXES, "client": {"concurrency": [8]}}}
# Run B: another engine seed (so other fingerprints), one more concurrency, and
# flashinfer_mxfp4 20% faster; marlin is drawn from the same distribution as in run A.
MATRIX_B = {
    "matrix": {"server": SERVER_AXES, "client": {"concurrency": [8, 16]}},
    "engine": {"sim": {"seed": 99}},
}
MARLIN = "moe_runner_backend~marlin,chunked_prefill_size~8192"
FLASHINFER = "moe_runner_backend~flashinfer_mxfp4,chunked_prefill_size~8192"


def detailed_record(
    rng: np.random.Generator, *, scale: float, n: int = 40, input_len: int = 16384
) -> dict:
    """A consistent 1-token-output record: summary figures computed from its details."""
    ttft = scale * rng.lognormal(np.log(0.5), 0.15, n)
    latency = ttft + 0.002
    duration = float(latency.sum() / 8)

    def ms(x: float) -> float:
        return float(x) * 1000

    return {
        "completed": n,
        "duration": duration,
        "total_input_tokens": n * input_len,
        "total_output_tokens": n,
        "input_throughput": n * input_len / duration,
        "output_throughput": n / duration,
        "request_throughput": n / duration,
        "median_ttft_ms": ms(np.median(ttft)),
        "p95_ttft_ms": ms(np.percentile(ttft, 95)),
        "p99_ttft_ms": ms(np.percentile(ttft, 99)),
        "mean_ttft_ms": ms(ttft.mean()),
        "median_e2e_latency_ms": ms(np.median(latency)),
        "p99_e2e_latency_ms": ms(np.percentile(latency, 99)),
        "mean_e2e_latency_ms": ms(latency.mean()),
        "concurrency": float(latency.sum() / duration),
        "input_lens": [input_len] * n,
        "output_lens": [1] * n,
        "ttfts": ttft.tolist(),
        "itls": [[] for _ in range(n)],
        "generated_texts": ["x"] * n,
        "errors": [""] * n,
    }


def gpu_snapshot() -> list[dict]:
    text = (DATA / "nvidia-smi-8gpu" / "query-idle-8gpu-noheader-nounits.csv").read_text()
    meta = {"phase": "before", "node": "local", "status": "ok", "detail": ""}
    return [{**row, **meta} for row in telemetry.parse_noheader(text)]


def write_run(
    workdir: Path, run_id: str, changes: dict, scale: Callable[[CellRepeat], float], seed: int
) -> Path:
    """Raw records, GPU snapshots and results.csv of a run, as the workflow leaves them."""
    cfg = experiment_file(workdir, {"run_id": run_id, **changes}, name=f"{run_id}.yaml")
    exp = load_experiment_file(cfg)
    paths = RunPaths.for_run(exp, workdir / "results")
    rng = np.random.default_rng(seed)
    snapshot = gpu_snapshot()
    cells = cell_repeats(exp)
    for cell in cells:
        write_record(paths.raw(cell), detailed_record(rng, scale=scale(cell)))
        gpufile.write_snapshot(paths.gpu(cell), snapshot)
    results, requests = collect_results(
        run_id=run_id,
        cells=cells,
        raw=[paths.raw(c) for c in cells],
        gpu=[paths.gpu(c) for c in cells],
    )
    write_requests_csv(requests, paths.requests_csv)
    write_results_csv(results, paths.results_csv)  # written last: newest file
    return cfg


def load(run_dir: Path):
    """compare.load_run on a run folder, as the workflow's compare_runs job calls it."""
    found = compare.run_inputs(run_dir=run_dir)
    return compare.load_run(
        results_csv=found["csv"], requests_csv=next(iter(found["requests"]), None)
    )


def faster_flashinfer(cell: CellRepeat) -> float:
    return 0.8 if cell.server.axes["moe_runner_backend"] == "flashinfer_mxfp4" else 1.0


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("compare")
    write_run(workdir, "A", MATRIX_A, lambda _: 1.0, seed=1)
    write_run(workdir, "B", MATRIX_B, faster_flashinfer, seed=2)
    return workdir


@pytest.fixture(scope="module")
def comparison(runs: Path) -> dict:
    results_a, requests_a = load(runs / "results" / "A")
    results_b, requests_b = load(runs / "results" / "B")
    return compare.compare_runs(
        results_a=results_a,
        results_b=results_b,
        run_a="A",
        run_b="B",
        requests_a=requests_a,
        requests_b=requests_b,
    )


def cell(comparison: dict, server_id: str) -> dict:
    return next(c for c in comparison["cells"] if c["server_id"] == server_id)


# ---------------------------------------------------------------- compare_runs


def test_common_cells_and_fingerprints(comparison):
    assert [(c["server_id"], c["client_id"]) for c in comparison["cells"]] == [
        (MARLIN, "concurrency~8"),
        (FLASHINFER, "concurrency~8"),
    ]
    assert comparison["only_in_a"] == []
    assert comparison["only_in_b"] == [
        {"server_id": MARLIN, "client_id": "concurrency~16"},
        {"server_id": FLASHINFER, "client_id": "concurrency~16"},
    ]
    assert [f["server_id"] for f in comparison["fingerprints"]] == [MARLIN, FLASHINFER]
    assert all(f["changed"] for f in comparison["fingerprints"])
    assert "fingerprints differ" in comparison["note"]
    first = comparison["cells"][0]
    assert first["fingerprint_a"] != first["fingerprint_b"]
    assert first["axes"] == {
        "moe_runner_backend": "marlin",
        "chunked_prefill_size": 8192,
        "concurrency": 8,
    }
    assert (first["n_a"], first["n_b"], first["coarse"]) == (3, 3, True)


def test_verdicts_of_a_real_effect_and_of_no_effect(comparison):
    fast = cell(comparison, FLASHINFER)["metrics"]
    for metric in ("ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms"):
        m = fast[metric]
        assert m["verdict"] == "better", metric
        assert m["delta_pct"] < 0 and m["ci_low"] <= m["delta_pct"] <= m["ci_high"] < 0
    assert fast["input_tps"]["verdict"] == "better" and fast["input_tps"]["delta_pct"] > 0
    same = cell(comparison, MARLIN)["metrics"]
    for metric in ("ttft_p50_ms", "e2e_p50_ms"):
        assert same[metric]["verdict"] == "within noise", metric
        assert same[metric]["ci_low"] < 0 < same[metric]["ci_high"]
    assert {"ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "e2e_p50_ms", "input_tps"} <= set(fast)
    assert "tpot_p50_ms" not in fast  # 1-token outputs
    assert fast["ttft_p50_ms"]["resampled"] == "repeats+requests"
    assert fast["input_tps"]["resampled"] == "repeats"
    assert comparison["verdict_counts"]["ttft_p50_ms"] == {
        "better": 1,
        "worse": 0,
        "within noise": 1,
        "unknown": 0,
    }


def test_medians_come_from_the_results_tables(runs, comparison):
    a = pd.read_csv(runs / "results" / "A" / "results.csv")
    b = pd.read_csv(runs / "results" / "B" / "results.csv")
    m = cell(comparison, FLASHINFER)["metrics"]["ttft_p99_ms"]
    assert m["median_a"] == pytest.approx(a[a.server_id == FLASHINFER]["ttft_p99_ms"].median())
    rows_b = b[(b.server_id == FLASHINFER) & (b.client_id == "concurrency~8")]
    assert m["median_b"] == pytest.approx(rows_b["ttft_p99_ms"].median())
    assert m["delta_pct"] == pytest.approx(100 * (m["median_b"] - m["median_a"]) / m["median_a"])


def test_method_block_and_determinism(runs, comparison):
    method = comparison["method"]
    assert method["replicates"] == 2000 and method["repeats"]["3"]["coarse"] is True
    assert method["resampled"]["ttft_p50_ms"] == "repeats+requests"
    assert "B - A" in comparison["direction"]
    results_a, requests_a = load(runs / "results" / "A")
    results_b, requests_b = load(runs / "results" / "B")
    again = compare.compare_runs(
        results_a=results_a,
        results_b=results_b,
        run_a="A",
        run_b="B",
        requests_a=requests_a,
        requests_b=requests_b,
    )
    assert again == comparison


def test_a_run_against_itself_is_within_noise(runs):
    results, requests = load(runs / "results" / "A")
    same = compare.compare_runs(
        results_a=results,
        results_b=results,
        run_a="A",
        run_b="A",
        requests_a=requests,
        requests_b=requests,
    )
    assert same["note"] is None
    assert not any(f["changed"] for f in same["fingerprints"])
    for c in same["cells"]:
        for metric, m in c["metrics"].items():
            assert m["delta_pct"] == 0 and m["verdict"] == "within noise", metric
            assert m["p_adjusted"] >= 0.05, metric


def test_without_per_request_data_and_with_a_missing_raw_file(runs, tmp_path):
    results_a, _ = load(runs / "results" / "A")
    results_b, requests_b = load(runs / "results" / "B")
    plain = compare.compare_runs(results_a=results_a, results_b=results_b, run_a="A", run_b="B")
    m = cell(plain, FLASHINFER)["metrics"]["ttft_p50_ms"]
    assert m["resampled"] == "repeats" and m["verdict"] == "better"
    # A copy of run A without the requests of one cell-repeat: that cell falls back to repeats.
    copy = tmp_path / "results" / "A"
    shutil.copytree(runs / "results" / "A", copy)
    table = read_requests_csv(copy / "requests.csv")
    client = table[table.server_id == MARLIN].client_id.iloc[0]
    gone = (table.server_id == MARLIN) & (table.client_id == client) & (table.repeat == 2)
    assert gone.any()
    write_requests_csv(table[~gone], copy / "requests.csv")
    inputs = compare.run_inputs(run_dir=copy)
    assert inputs == {
        "csv": str(copy / "results.csv"),
        "requests": [str(copy / "requests.csv")],
        "probes": [],
    }
    results_c, requests_c = load(copy)
    assert sum(r is None for r in requests_c.values()) == 1
    mixed = compare.compare_runs(
        results_a=results_c,
        results_b=results_b,
        run_a="A",
        run_b="B",
        requests_a=requests_c,
        requests_b=requests_b,
    )
    # A's marlin cell: repeats only; B's: requests too. The flashinfer cell: both.
    assert cell(mixed, MARLIN)["metrics"]["ttft_p50_ms"]["resampled"] == "mixed"
    assert cell(mixed, FLASHINFER)["metrics"]["ttft_p50_ms"]["resampled"] == "repeats+requests"
    assert mixed["method"]["resampled"]["ttft_p50_ms"] == "mixed"
    nope = tmp_path / "nope"
    assert compare.run_inputs(run_dir=nope) == {
        "csv": str(nope / "results.csv"),
        "requests": [],
        "probes": [],
    }
    made = compare.run_inputs(run_dir=nope, current=True)["requests"]
    assert made == [str(nope / "requests.csv")], "the current run's table is made by the workflow"


def test_no_cells_in_common(runs):
    results_a, _ = load(runs / "results" / "A")
    results_b, _ = load(runs / "results" / "B")
    other = results_b[results_b.client_id == "concurrency~16"]
    none = compare.compare_runs(results_a=results_a, results_b=other, run_a="A", run_b="B")
    assert none["cells"] == [] and none["metrics"] == {}
    assert none["note"] == "no cells in common (matched by server_id + client_id)"
    assert len(none["only_in_a"]) == 2 and len(none["only_in_b"]) == 2
    assert compare.comparison_table(none).empty
    fig = plots.plot_comparison(none)
    assert "No cells in common" in "\n".join(t.get_text() for ax in fig.axes for t in ax.texts)


# ---------------------------------------------------------------- outputs


def test_table_json_and_plot(comparison, tmp_path):
    table = compare.comparison_table(comparison)
    assert list(table.columns) == compare.TABLE_COLUMNS
    assert len(table) == 2 * len(cell(comparison, FLASHINFER)["metrics"])
    row = table[(table.server_id == FLASHINFER) & (table.metric == "ttft_p50_ms")].iloc[0]
    assert row["verdict"] == "better" and row["better_is"] == "lower"
    assert bool(row["fingerprint_changed"]) is True
    compare.write_table(table, tmp_path / "comparison.csv")
    back = pd.read_csv(tmp_path / "comparison.csv")
    assert list(back["verdict"]) == list(table["verdict"])
    compare.write_comparison(comparison, tmp_path / "comparison.json")
    loaded = json.loads((tmp_path / "comparison.json").read_text())
    assert loaded["cells"][1]["metrics"]["ttft_p50_ms"]["verdict"] == "better"

    fig = plots.plot_comparison(loaded, metrics=["ttft_p50_ms", "input_tps"])
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    widths = [p.get_width() for p in fig.axes[0].patches]
    assert sorted(widths) == pytest.approx(
        sorted(c["metrics"]["ttft_p50_ms"]["delta_pct"] for c in loaded["cells"])
    )
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    # fingerprints differ, and the label says what did
    assert all("\n* " in label for label in labels)
    changed = [c["what_changed"] for c in loaded["cells"]]
    assert "SIMULATED" not in fig.get_suptitle()  # both runs' rows say engine_kind sglang
    shown = zip(labels, changed, strict=True)
    assert all(label.endswith(textwrap.shorten(w, 48)) for label, w in shown)
    assert {t.get_text() for t in fig.legends[0].get_texts()} == {"better", "within noise"}
    plots.save_figure(fig, tmp_path / "comparison.png")
    assert (tmp_path / "comparison.png").read_bytes()[:4] == b"\x89PNG"


def test_summary_resamples_requests_from_raw_records(runs):
    exp = load_experiment_file(runs / "B.yaml")
    results, requests = load(runs / "results" / "B")
    kw = {"server_axes": list(exp.matrix.server), "client_axes": list(exp.matrix.client)}
    s = summarize(results=results, baseline=exp.baseline, requests=requests, **kw)
    cell0 = s["cells"][0]["metrics"]
    assert cell0["ttft_p99_ms"]["resampled"] == "repeats+requests"
    assert cell0["input_tps"]["resampled"] == "repeats"
    assert cell0["ttft_p99_ms"]["ci_low"] <= cell0["ttft_p99_ms"]["median"]
    assert cell0["ttft_p99_ms"]["median"] <= cell0["ttft_p99_ms"]["ci_high"]
    assert [d["metrics"]["ttft_p50_ms"]["verdict"] for d in s["deltas"]] == ["better", "better"]
    assert s["method"]["resampled"]["ttft_p50_ms"] == "repeats+requests"
    repeat_only = summarize(results=results, baseline=exp.baseline, **kw)
    assert repeat_only["cells"][0]["metrics"]["ttft_p99_ms"]["resampled"] == "repeats"
    assert summarize(results=results, baseline=exp.baseline, requests=requests, **kw) == s


# ---------------------------------------------------------------- the snakemake rule


def snakefile(workdir: Path) -> Path:
    """The repo Snakefile once it includes rules/compare.smk; until then a wrapper that does."""
    main = REPO / "Snakefile"
    if "rules/compare.smk" in main.read_text():
        return main
    wrapper = workdir / "Snakefile.compare"
    wrapper.write_text(f'include: "{main}"\ninclude: "{REPO / "rules" / "compare.smk"}"\n')
    return wrapper


def test_snakemake_compares_two_result_directories(runs):
    target = "results/A/compare/B"
    env = {k: v for k, v in os.environ.items() if not k.endswith("_CSV")}
    env.pop("RUN_ID", None)
    env.pop("EP_SIZE", None)
    args = [
        shutil.which("snakemake") or "snakemake",
        "-s",
        str(snakefile(runs)),
        "--workflow-profile",
        str(REPO / "profiles" / "default"),
        "-d",
        str(runs),
        "--cores",
        "1",
        f"{target}/comparison.json",
        f"{target}/comparison.png",
        "--configfile",
        str(runs / "A.yaml"),
    ]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "run_cell" not in out and "collect_results" not in out  # nothing of run A reran
    assert "compare_runs" in out and "plot_comparison" in out
    # the comparison's own block last, as `servesweep compare` prints it, not run A's answer
    assert "== servesweep: the answer" not in proc.stdout
    block = proc.stdout[proc.stdout.index("== servesweep: run B against run A: 2 cells") :]
    assert block.rstrip().endswith(f"comparison.png   {target}/comparison.png")
    result = json.loads((runs / target / "comparison.json").read_text())
    assert (result["run_a"], result["run_b"]) == ("A", "B")
    assert [c["metrics"]["ttft_p50_ms"]["verdict"] for c in result["cells"]] == [
        "within noise",
        "better",
    ]
    per_cell = len(result["cells"][0]["metrics"])
    assert len(pd.read_csv(runs / target / "comparison.csv")) == 2 * per_cell
    assert (runs / target / "comparison.png").read_bytes()[:4] == b"\x89PNG"


def test_what_changed_names_the_differing_layout():
    a = pd.DataFrame({"engine_kind": ["sim"] * 2, "ep_size": [8, 8], "tp_size": [8, 8]})
    assert compare.what_changed(a, a.assign(ep_size=4)) == "ep_size 8 -> 4"
    assert compare.what_changed(a, a).startswith("image, engine version or server arguments")
    b = a.assign(ep_size=4, engine_kind="sglang")
    assert compare.what_changed(a, b) == "engine_kind sim -> sglang; ep_size 8 -> 4"
    # layout columns are no axes unless the server id names them
    table = a.assign(server_id="x", moe_runner_backend="marlin")
    assert compare.axis_columns(table, server_id="moe_runner_backend~marlin") == [
        "moe_runner_backend"
    ]
    assert "ep_size" in compare.axis_columns(table, server_id="ep_size~8")


# ---------------------------------------------------------------- servesweep compare


def test_servesweep_compare_prints_b_against_a_with_the_outputs(runs, tmp_path, capsys):
    """`servesweep compare A B` (run ids or run folders): B's change against A per cell and
    metric, the equivalence probe's verdict where both runs probed a server config, the files."""
    from dataclasses import replace

    from servesweep.core.files import write_json_atomic
    from servesweep.measure.probefile import from_runner_probe
    from servesweep.workflow import cli

    results = tmp_path / "results"
    shutil.copytree(runs / "results", results)
    real = REPO / "tests" / "data" / "equivalence" / "runners-h100-2026-12-07.json"
    answers = from_runner_probe(json.loads(real.read_text()), run_id="h100")
    for run, runner in (("A", "triton"), ("B", "triton_kernel")):
        probe = replace(answers[runner], server=MARLIN, run_id=run, probe_key="probe")
        write_json_atomic(results / run / "equivalence" / f"{MARLIN}.json", probe.to_dict())
    assert cli.main(["compare", "A", str(results / "B"), "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("== servesweep: run B against run A: 2 cells in common")
    assert "the answer" not in out
    lines = out.splitlines()
    assert "TTFT p50 [ms]" in lines[2] and "input throughput [tok/s]" in lines[2]
    row = next(line for line in lines if "moe_runner_backend=flashinfer_mxfp4" in line)
    assert row.split()[-1] == "better" and "cache_flushed" not in row
    assert any(line.startswith("  verdicts over ") for line in lines)
    assert f"  {MARLIN}: within numerical tolerance: first token 4/4 agree" in out
    assert f"Only in run B: 2 cells ({MARLIN}/concurrency~16" in out
    saved = json.loads((results / "A" / "compare" / "B" / "comparison.json").read_text())
    assert (saved["run_a"], saved["run_b"]) == ("A", "B")
    assert saved["outputs"][0]["verdict"] == "within numerical tolerance"
    assert out.rstrip().endswith(f"comparison.png   {results}/A/compare/B/comparison.png")
    png = results / "A" / "compare" / "B" / "comparison.png"
    assert png.stat().st_mtime_ns >= (png.parent / "comparison.json").stat().st_mtime_ns
    assert cli.main(["compare", "A", "nope", "--results", str(results)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("servesweep: ConfigError: run 'nope': no results.csv") and err[-1] == "\n"
    with pytest.raises(SystemExit) as shown:
        cli.main(["compare", "--help"])
    assert shown.value.code == 0
