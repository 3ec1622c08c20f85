"""The default matrix end to end with real snakemake on the sim: files, starts, reruns."""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest
import yaml

from servesweep.core.events import read_events
from tests.helpers import REPO, experiment_file, free_port, run_snakemake

pytestmark = pytest.mark.workflow
RUN = "wf-default"
# The default matrix and repeats (24 cell-repeats, 4 server starts); the simulated time of a
# cell (16K-token prompts) made 5 times shorter and 16 requests a cell instead of 40: nothing
# here depends on either, only on the cells' shape.
TIME_SCALE = 0.001
REQUESTS = 16
SHORTER = {"run_id": RUN, "engine": {"sim": {"time_scale": TIME_SCALE}}}
SHORTER |= {"workload": {"num_requests": REQUESTS}}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("default")
    cfg = experiment_file(workdir, SHORTER)
    proc = run_snakemake(workdir, "--cores", "1", "all", "--configfile", str(cfg))
    assert proc.returncode == 0, proc.stderr[-4000:]
    (workdir / "stdout.txt").write_text(proc.stdout)
    (workdir / "stderr.txt").write_text(proc.stderr)
    return workdir / "results" / RUN


def _starts(run_dir: Path) -> list[dict[str, str]]:
    return [f for _, event, f in read_events(run_dir / "orchestrator.log") if event == "start"]


def _jobs(run_dir: Path, *args: str, env: dict[str, str] | None = None):
    workdir = run_dir.parents[1]
    return run_snakemake(workdir, *args, "--configfile", str(workdir / "exp.yaml"), env=env)


def test_every_cell_repeat_has_its_files(run_dir: Path) -> None:
    raws = sorted(run_dir.glob("raw/*/*/r*.jsonl"))
    assert len(raws) == 24
    assert len(list(run_dir.glob("gpu/*/*/r*.csv"))) == 24
    assert len(list(run_dir.glob("bench/*/*/r*.log"))) == 24
    gpu = pd.read_csv(next(iter(run_dir.glob("gpu/*/*/r*.csv"))))
    snapshots = gpu[gpu["phase"].isin(["before", "after"])]
    assert set(snapshots["status"]) == {"unavailable"}, "this machine has no nvidia-smi"
    samples = gpu[gpu["phase"] == "sample"]
    assert len(samples) and set(samples["status"]) == {"simulated"}, "the sim's power curve"
    for name in ("results.csv", "summary.json", "manifest.json"):
        assert (run_dir / name).stat().st_size > 0
    assert len(list(run_dir.glob("plots/*.png"))) == 10  # server_series.png: the /metrics
    assert (run_dir / "plots" / "energy_goodput_vs_concurrency.png").stat().st_size > 0


def test_the_console_has_a_line_per_cell_and_ends_with_the_answer(run_dir: Path) -> None:
    # the cell lines on stderr beside Snakemake's log; the answer last on stdout
    stderr = (run_dir.parents[1] / "stderr.txt").read_text()
    cells = [line for line in stderr.splitlines() if line.startswith("[")]
    assert len([c for c in cells if "/24] " in c and " ETA " in c]) == 24, cells
    assert any(c.startswith("[24/24] ") for c in cells)
    stdout = (run_dir.parents[1] / "stdout.txt").read_text().splitlines()
    answer = max(i for i, line in enumerate(stdout) if line.startswith("== servesweep: the answer"))
    block = "\n".join(stdout[answer:])
    assert stdout[-1] == f"  report        results/{RUN}/report.html"
    assert "moe_runner_backend=flashinfer_mxfp4 vs baseline moe_runner_backend=marlin" in block
    assert "verdicts over" in block and "-0.0" not in block
    for name in ("results.csv", "summary.json", "report.html"):
        assert f"results/{RUN}/{name}" in block
    page = (run_dir / "report.html").read_text()
    assert page.index("id='deltas'") < page.index("id='all-plots'") < page.index("id='method'")
    df = pd.read_csv(run_dir / "results.csv")
    assert set(df["gpu_status"]) == {"simulated"}


def test_the_sims_log_noise_is_said_but_no_warning_as_the_readme_shows(run_dir: Path) -> None:
    """The sim's deliberate startup warnings (UserWarning, default MoE config) are named as
    its noise beside the warnings, not among them; the README's answer example has the line."""
    stdout = (run_dir.parents[1] / "stdout.txt").read_text()
    block = stdout[stdout.rindex("== servesweep: the answer") :]
    said = block[block.index("\nWarnings:") : block.index("\nFiles:")]
    assert "Server logs: warning" not in said, said
    noise = [ln for ln in said.splitlines() if "the simulated engine's deliberate log noise" in ln]
    assert len(noise) == 1 and "moe_default_config x 4, user_warning x 4" in noise[0], said
    assert noise[0] in (REPO / "README.md").read_text(), "the README shows a real answer"


def test_full_matrix_starts_each_server_config_once(run_dir: Path) -> None:
    starts = _starts(run_dir)
    assert len(starts) == 4
    assert len({s["fp"] for s in starts}) == 4
    events = [e for _, e, _ in read_events(run_dir / "orchestrator.log")]
    assert events.count("ready") == 4
    assert events.count("stop") == 4
    assert events.count("cell-done") == 24
    # Repeats interleaved within each server config (r1 of both client cells, then r2, r3);
    # orchestrator.log's cell-start events record the order.
    order = [
        f["cell"] for _, e, f in read_events(run_dir / "orchestrator.log") if e == "cell-start"
    ]
    first = [c for c in order if c.startswith(order[0].split("/")[0] + "/")]
    assert [c.rsplit("/", 1)[1] for c in first[:6]] == ["r1", "r1", "r2", "r2", "r3", "r3"]


def test_results_and_summary(run_dir: Path) -> None:
    df = pd.read_csv(run_dir / "results.csv")
    assert len(df) == 24
    assert set(df["moe_runner_backend"]) == {"marlin", "flashinfer_mxfp4"}
    assert set(df["chunked_prefill_size"]) == {8192, 16384}
    assert set(df["concurrency"]) == {8, 16}
    assert (df["completed"] == REQUESTS).all()
    assert (df["total_input_tokens"] == REQUESTS * 16384).all()
    # 1-token outputs keep their text, special tokens included (skip_special_tokens: false), so
    # they re-tokenize exactly; the noisy sim's drift shows on longer outputs (test_pd_suite)
    assert (df["retokenized_ratio"] == 1).all()
    # energy from the sim's simulated power curve, marked so, never passed off as measured
    assert set(df["gpu_source"]) == {"simulated"}
    assert (df["gpu_energy_j"] > 0).all() and (df["gpu_power_mean_w"] > 0).all()
    # the builtin's process measured from outside too (loadgen.usage), start-up included
    assert (df["client_process_cpu_s"] > 0).all()
    assert (df["client_process_wall_s"] > df["duration_s"]).all()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert len(summary["cells"]) == 8
    assert summary["deltas"], "flashinfer_mxfp4 vs marlin deltas"
    # its startup warnings are counted, never fatal
    assert summary["log_scan"]["fatal_findings"] == 0
    assert summary["log_scan"]["warnings"]["moe_default_config"] >= 4
    assert summary["log_scan"]["warnings"]["user_warning"] >= 4
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert {s["fingerprint"] for s in manifest["servers"]} == set(df["fingerprint"])
    assert manifest["git_sha"]


def test_results_say_simulated_and_leave_undefined_figures_blank(run_dir: Path) -> None:
    df = pd.read_csv(run_dir / "results.csv")
    assert set(df["engine_kind"]) == {"sim"} and set(df["sim_time_scale"]) == {TIME_SCALE}
    # scaled back to simulated time (8 significant digits in the file)
    ratio = df["simulated_ttft_p50_ms"] / (df["ttft_p50_ms"] / TIME_SCALE)
    assert ratio.between(1 - 1e-5, 1 + 1e-5).all()
    assert set(df["ep_size"]) == {8}  # EP_SIZE is no axis, still a column
    # every output is one token: TPOT and ITL are undefined, blank rather than 0.0
    assert df[["tpot_p50_ms", "tpot_p95_ms", "itl_p50_ms"]].isna().all().all()
    assert "request_throughput_rps" in df.columns and "request_tps" not in df.columns
    server = json.loads(next(run_dir.glob("service/*/server.json")).read_text())
    assert datetime.fromisoformat(server["started_at"]).tzinfo is not None


def _strict(text: str) -> None:
    def refuse(constant: str) -> None:
        raise ValueError(f"non-JSON constant {constant}")

    json.loads(text, parse_constant=refuse)


def test_every_json_file_is_strict_json(run_dir: Path) -> None:
    files = [*run_dir.rglob("*.json"), *run_dir.rglob("*.jsonl")]
    assert len(files) > 24
    for path in files:
        lines = path.read_text().splitlines() if path.suffix == ".jsonl" else [path.read_text()]
        for line in filter(str.strip, lines):
            _strict(line)
    record = json.loads(next(run_dir.glob("raw/*/*/r1.jsonl")).read_text())
    assert record["request_rate"] is None and record["non_finite"] == {"/request_rate": "inf"}


def test_report_opens_on_the_answer_in_a_browser(run_dir: Path, tmp_path: Path) -> None:
    """`snakemake --report` in headless Chromium at two window sizes: the landing page's
    heading is on screen (it sat at y = -359 px) and its delta table is there."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("SERVESWEEP_REQUIRE_BROWSER"):
            pytest.fail("chromium not found, and SERVESWEEP_REQUIRE_BROWSER is set")
        pytest.skip("chromium not found (apt-get install chromium)")
    report = tmp_path / "report.html"
    proc = _jobs(run_dir, "--report", str(report))
    assert proc.returncode == 0, proc.stderr[-3000:]
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            for width, height in ((1400, 900), (1920, 1080)):
                page = browser.new_page(viewport={"width": width, "height": height})
                page.goto(report.as_uri())
                page.wait_for_selector("#app .prose h1", timeout=60_000)
                found = page.evaluate(LANDING_PROBE)
                assert found["heading"] == f"Run {RUN}: what it measured", found
                assert found["top"] >= 0 and found["bottom"] <= height, (width, height, found)
                assert 0 <= found["left"] < width, (width, height, found)
                assert found["delta_rows"] >= 4 * 4, found  # 4 candidate cells x 4 metrics
                assert "SIMULATED" in found["text"], "a sim run says so on its first screen"
                page.close()
        finally:
            browser.close()


# The landing page's heading (its box in the window) and its delta table, as the browser
# laid them out.
LANDING_PROBE = """() => {
  const h = document.querySelector('#app .prose h1');
  const box = h.getBoundingClientRect();
  const rows = document.querySelectorAll('#app .prose table#deltas tbody tr');
  return {heading: h.textContent.trim(), top: box.top, bottom: box.bottom, left: box.left,
          delta_rows: rows.length, text: document.querySelector('#app .prose').innerText};
}"""


def test_second_run_has_nothing_to_do(run_dir: Path) -> None:
    before = len(_starts(run_dir))
    proc = _jobs(run_dir, "--cores", "1", "all")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Nothing to be done" in proc.stdout + proc.stderr
    assert len(_starts(run_dir)) == before


def test_reordered_keys_and_a_new_port_have_nothing_to_do(run_dir: Path) -> None:
    workdir = run_dir.parents[1]
    raw = yaml.safe_load((workdir / "exp.yaml").read_text())
    raw["matrix"]["server"] = dict(reversed(list(raw["matrix"]["server"].items())))
    raw["engine"]["port"] = free_port()
    raw["engine"]["ready_timeout_s"] = 99
    moved = workdir / "moved.yaml"
    moved.write_text(yaml.safe_dump(raw, sort_keys=False))
    proc = run_snakemake(workdir, "--cores", "1", "all", "--configfile", str(moved))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Nothing to be done" in proc.stdout + proc.stderr


def test_deleted_raw_file_reruns_exactly_that_cell_with_one_start(run_dir: Path) -> None:
    victim = sorted(run_dir.glob("raw/*/*/r2.jsonl"))[-1]
    victim.unlink()
    before = len(_starts(run_dir))
    done_before = sum(e == "cell-done" for _, e, _ in read_events(run_dir / "orchestrator.log"))
    proc = _jobs(run_dir, "--cores", "1", "all")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert victim.exists()
    starts = _starts(run_dir)
    assert len(starts) == before + 1
    events = read_events(run_dir / "orchestrator.log")
    done = [f for _, e, f in events if e == "cell-done"]
    assert len(done) == done_before + 1
    assert done[-1]["cell"] == str(victim.relative_to(run_dir / "raw")).removesuffix(".jsonl")


def test_every_declared_log_is_written(run_dir: Path) -> None:
    # The rules' `log:` files (logsetup.job_logging; bench logs by the client), none empty.
    jobs = {p.name for p in run_dir.glob("logs/*.log")}
    assert jobs == {
        "preflight.log",
        "collect_results.log",
        "scan_logs.log",
        "summarize.log",
        "plot_results.log",
        "plot_server_series.log",
        "write_manifest.log",
        "write_landing_page.log",
        "write_report.log",
        "compare_outputs.log",
    }
    cell_logs = sorted(run_dir.glob("logs/run_cell/*/*/r*.log"))
    bench_logs = sorted(run_dir.glob("bench/*/*/r*.log"))
    probe_logs = sorted(run_dir.glob("logs/probe_outputs/*.log"))
    assert len(cell_logs) == len(bench_logs) == 24
    assert len(probe_logs) == len(list(run_dir.glob("equivalence/*.json"))) == 4
    empty = [
        p
        for p in [*run_dir.glob("logs/*.log"), *cell_logs, *bench_logs, *probe_logs]
        if not p.stat().st_size
    ]
    assert not empty, f"declared logs left empty: {empty}"
    assert "cell-done" in cell_logs[0].read_text()


def test_configfile_replaces_the_embedded_default(tmp_path: Path) -> None:
    cfg = experiment_file(tmp_path, {"run_id": "from-configfile"})
    proc = run_snakemake(tmp_path, "-n", "--configfile", str(cfg))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "results/from-configfile/raw/" in proc.stdout
    assert "results/moe-prefill-sim/" not in proc.stdout


def test_a_targeted_cell_on_a_fresh_run_builds_its_prerequisites(tmp_path: Path) -> None:
    cfg = experiment_file(tmp_path, {**SHORTER, "run_id": "targeted", "repeats": 2})
    raw = (
        "results/targeted/raw/moe_runner_backend~marlin,chunked_prefill_size~8192/"
        "concurrency~8/r2.jsonl"
    )
    proc = run_snakemake(tmp_path, "--cores", "1", "-f", raw, "--configfile", str(cfg))
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / "results" / "targeted"
    assert (tmp_path / raw).exists() and (run_dir / "preflight.json").exists()
    assert [p.relative_to(run_dir).as_posix() for p in run_dir.glob("raw/*/*/*")] == [
        raw.removeprefix("results/targeted/")
    ]


def test_the_readme_rerun_refreshes_the_answer_and_a_cell_alone_prints_none_stale(
    tmp_path: Path,
) -> None:
    """README "Rerun one cell": `all --forcerun <raw>` reruns the cell and everything after
    it; `-f <raw>` alone reruns the cell and says the answer is stale instead of printing it."""
    one = {"server": {"moe_runner_backend": ["marlin"], "chunked_prefill_size": [8192]}}
    one |= {"client": {"concurrency": [8]}}
    cfg = experiment_file(tmp_path, {**SHORTER, "run_id": "rerun", "matrix": one, "repeats": 1})
    run_dir = tmp_path / "results" / "rerun"
    proc = run_snakemake(tmp_path, "--cores", "1", "all", "--configfile", str(cfg))
    assert proc.returncode == 0, proc.stderr[-3000:]
    raw = next(run_dir.glob("raw/*/*/r1.jsonl"))
    measured = raw.stat().st_mtime_ns
    forced = str(raw.relative_to(tmp_path))
    args = ("--cores", "1", "all", "--forcerun", forced, "--configfile", str(cfg))
    proc = run_snakemake(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "== servesweep: the answer of run rerun" in proc.stdout
    for name in ("results.csv", "summary.json", "report.html"):
        assert (run_dir / name).stat().st_mtime_ns > raw.stat().st_mtime_ns, name
    assert raw.stat().st_mtime_ns > measured, "the cell was measured again"
    proc = run_snakemake(tmp_path, "--cores", "1", "-f", forced, "--configfile", str(cfg))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "== servesweep: the answer" not in proc.stdout
    assert (run_dir / "summary.json").stat().st_mtime_ns < raw.stat().st_mtime_ns
    stale = proc.stdout.strip().splitlines()[-1]
    assert stale.startswith("servesweep: no answer printed:") and forced in stale, stale
    snakefile = REPO / "Snakefile"
    assert f"`snakemake --cores 1 -s {snakefile} -d {tmp_path} all --configfile {cfg}`" in stale


def test_every_cell_has_its_servers_metrics_series_and_figures(run_dir: Path) -> None:
    """Every rank's /metrics during each cell (telemetry.metrics_interval_s), and the load
    figures over the client's window in results.csv; no PD stages, no TTFT breakdown."""
    from servesweep.measure import servermetrics

    series = sorted(run_dir.glob("metrics/*/*/r*.jsonl.gz"))
    assert len(series) == 24
    lines = servermetrics.read_lines(series[0])
    header = lines[0]["header"]
    assert header["window"][0] < header["window"][1]
    assert [t["role"] for t in header["targets"]] == ["server"]
    assert "full" in lines[1] and len(lines) > 3
    df = pd.read_csv(run_dir / "results.csv")
    assert (df["server_scrapes"] >= 2).all()
    # One 16K prefill at a time (output 1): the others wait in the queue
    held = df["server_running_reqs_peak"] + df["server_queue_reqs_peak"]
    assert held.max() >= 1 and (held <= df["concurrency"]).all()
    assert (df["server_kv_usage_peak"] >= 0).all() and df["server_kv_usage_peak"].max() > 0
    assert df["ttft_transfer_ms"].isna().all()
    assert (run_dir / "plots" / "server_series.png").stat().st_size > 0  # a panel per cell
    assert "server_series" in (run_dir / "report.html").read_text()
