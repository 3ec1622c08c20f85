"""Seed 003's PD suite on the embedded engine: roles, router, cases, warm-up, evidence."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from servesweep.cluster.owner import current_owner
from servesweep.cluster.runtime import ProcessRuntime
from servesweep.cluster.transport import LocalTransport
from servesweep.config.load import load_experiment_file
from servesweep.core.events import read_events
from servesweep.workflow.cli import main as cli
from tests.helpers import REPO, deep_update, free_port, run_snakemake

pytestmark = pytest.mark.workflow
LOCAL_PD = REPO / "config" / "experiments" / "pd_standard_local.yaml"


def pd_config(directory: Path, run_id: str, **changes: object) -> Path:
    """The local PD experiment with fresh ports for every listener."""
    raw = yaml.safe_load(LOCAL_PD.read_text())
    ports = {
        "run_id": run_id,
        "roles": {
            "prefill": {
                "port": free_port(),
                "dist_init_port": free_port(),
                "server": {"disaggregation_bootstrap_port": free_port()},
            },
            "decode": {"port": free_port(), "dist_init_port": free_port()},
        },
        "router": {"port": free_port()},
        "engine": {"sim": {"time_scale": 0.02, "startup_s": 20}},
        # The concurrency-8 cases one wave of 8 requests instead of the seed's 40 (most of a
        # run's streamed tokens): what these tests read is a case's shape, its rows and
        # evidence, not its count (test_pd_cluster keeps the seed's 40).
        "cases": {name: {"num_requests": 8} for name in ("16k-1-c8", "16k-512-c8")},
    }
    path = directory / "pd.yaml"
    path.write_text(yaml.safe_dump(deep_update(deep_update(raw, ports), changes), sort_keys=False))
    return path


@pytest.fixture(scope="module")
def pd_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    workdir = tmp_path_factory.mktemp("pd")
    cfg = pd_config(workdir, "wf-pd", suite="all")  # every case (the default is "standard")
    proc = run_snakemake(workdir, "--cores", "1", "all", "--configfile", str(cfg))
    assert proc.returncode == 0, proc.stderr[-4000:]
    (workdir / "console.txt").write_text(proc.stdout + proc.stderr)  # what the user saw
    return workdir / "results" / "wf-pd"


def test_the_answer_shows_each_case_against_the_reference(pd_run: Path) -> None:
    """The console's answer has numbers: every case against seed 003's reference, and lists
    cases.md and cases.html; the HTML shows bold deltas as bold, never as `**`."""
    console = (pd_run.parent.parent / "console.txt").read_text()
    answer = console[console.rindex("== servesweep: the answer") :]
    assert "Cases against the reference" in answer
    for case in ("64-8-c1", "1k-16-c1-nonstream", "16k-1-c1", "16k-1-c8"):
        assert f"\n  {case} " in answer, answer
    assert "No deltas" not in answer
    files = answer[answer.index("\nFiles:") :]
    for name in ("cases.md", "cases.html"):
        assert re.search(rf"^  {name}\s+\S*results/wf-pd/{name}$", files, re.M), files
    assert "**" not in (pd_run / "cases.html").read_text()


def test_one_server_set_started_prefill_decode_router(pd_run: Path) -> None:
    events = read_events(pd_run / "orchestrator.log")
    assert [e for _, e, _ in events].count("start") == 1
    roles = [f["role"] for _, e, f in events if e == "role-ready"]
    assert roles == ["prefill", "decode", "router"]
    # On disjoint GPUs both engines start in one wave (launched together, each ready before
    # the router's wave); the timing of that overlap is the acceptance's, not a test's: a busy
    # machine stretches imports and start-up alike.
    waves = {f["role"]: f["wave"] for _, e, f in events if e == "role-ready"}
    assert waves == {"prefill": "1", "decode": "1", "router": "2"}
    (ready,) = [float(f["seconds"]) for _, e, f in events if e == "ready"]
    # where that start went, as every cell's record keeps it (the sim logs SGLang's summary)
    results = pd.read_csv(pd_run / "results.csv")
    assert (results["start_ready_s"] == ready).all()
    assert (results["start_cuda_graph_s"] > 0).all() and (results["start_imports_s"] > 0).all()
    commands = (pd_run / "service" / "pd" / "commands.sh").read_text()
    order = [line.split()[2] for line in commands.splitlines() if line.startswith("# role")]
    assert order == ["prefill"] * 4 + ["decode"] * 4 + ["router"]
    assert "--disaggregation-mode prefill" in commands
    assert "servesweep.sim.router --pd-disaggregation --mini-lb" in commands


def test_every_case_ran_with_the_requested_tokens(pd_run: Path) -> None:
    raws = sorted(pd_run.glob("raw/pd/case~*/r1.jsonl"))
    assert len(raws) == 6
    for raw in raws:
        record = json.loads(raw.read_text())
        assert record["completed"] == len(record["output_lens"])
        assert len(set(record["output_lens"])) == 1
        assert all(t > 0 for t in record["ttfts"]), "every first token timed"
    # behind the router the builtin has no /server_info to know the sim by: it records the
    # server's count (ratio 1); bench_serving's drift on the noisy sim is in tests/contract
    ratios = pd.read_csv(pd_run / "results.csv")["retokenized_ratio"]
    assert ratios.between(0.5, 1).all()
    text = (pd_run / "cases.md").read_text()
    table, versus = text.split("Against the reference")
    table = table.splitlines()
    assert table[0] == "| Case | Requests | Input TPS | TTFT P50 / P95 | TPOT P50 / P95 |"
    # Seed 003's validated table beside it, in simulated units, one row per case with deltas
    refs = [ln for ln in versus.splitlines() if ln.startswith("| ") and " s |" in ln]
    assert len(refs) == 6 and "| 16k-1-c8 |" in versus and "20.555 / 21.345 s" in versus
    assert "(simulated seconds and TPS)" in versus and "outside ±10%" in versus
    rows = {line.split(" | ")[0].lstrip("| "): line for line in table[2:] if line.startswith("|")}
    assert "time_scale 0.02" in table[-2], "the sim's time scale is stated under the table"
    assert set(rows) == {
        "64 -> 8, C1",
        "1K -> 16, C1, non-streaming",
        "16K -> 1, C1",
        "16K -> 1, C8",
        "16K -> 512, C1",
        "16K -> 512, C8",
    }
    assert rows["16K -> 1, C8"].endswith("| N/A |")
    assert rows["1K -> 16, C1, non-streaming"].endswith("| N/A |")
    assert rows["16K -> 512, C8"].endswith(" ms |")


def test_the_non_streamed_case_has_no_tpot_or_itl(pd_run: Path) -> None:
    """Seed 003: TPOT is N/A for `1k-16-c1-nonstream`, whose client writes 0.0. Blank in
    results.csv and requests.csv, null in summary.json, N/A against the reference."""
    nonstream = "case~1k-16-c1-nonstream"
    raw = json.loads((pd_run / "raw" / "pd" / nonstream / "r1.jsonl").read_text())
    assert raw["median_tpot_ms"] == 0.0  # the raw record keeps what the client wrote
    df = pd.read_csv(pd_run / "results.csv").set_index("client_id")
    timing = [c for c in df.columns if c.startswith(("tpot_p", "itl_p"))]
    assert len(timing) == 10 and df.loc[nonstream, timing].isna().all()
    assert df.loc["case~16k-512-c8", timing].notna().all()  # a streamed case keeps them
    assert not df["tpot_zero"].any()
    requests = pd.read_csv(pd_run / "requests.csv")
    assert requests.loc[requests["client_id"] == nonstream, "tpot_ms"].isna().all()
    summary = json.loads((pd_run / "summary.json").read_text())
    [cell] = [c for c in summary["cells"] if c["axes"]["case"] == "1k-16-c1-nonstream"]
    assert cell["metrics"]["tpot_p50_ms"]["median"] is None
    [row] = [ln for ln in (pd_run / "cases.md").read_text().splitlines() if "nonstream |" in ln]
    tpot, reference, delta = [c.strip() for c in row.strip(" |").split("|")][-3:]
    assert tpot == reference == delta == "N/A", row
    # the report's first page shows the same row: N/A, no 0
    page = (pd_run / "report.rst").read_text()
    cells = page.split("<td>1k-16-c1-nonstream</td>")[1].split("</tr>")[0]
    assert cells.count("<td>N/A</td>") == 3 and "0.00" not in cells, cells


def test_summary_has_warmup_log_scan_and_evidence(pd_run: Path) -> None:
    summary = json.loads((pd_run / "summary.json").read_text())
    assert [w["server_id"] for w in summary["warmup"]] == ["pd"]
    scan = summary["log_scan"]
    assert scan["logs_scanned"] == 9
    assert scan["fatal_findings"] == 0
    assert scan["evidence"]["p_state_slice_transfer"] > 0
    assert scan["evidence"]["d_rdma_ready_ack"] > 0
    # every cell-repeat met every required minimum (else it would be invalid): counts above 0
    df = pd.read_csv(pd_run / "results.csv")
    required = [c for c in df.columns if c.startswith("evidence_")]
    assert sorted(required) == [
        "evidence_d_rdma_ready_ack",
        "evidence_p_state_slice_mode",
        "evidence_p_state_slice_transfer",
    ]
    assert (df[required] > 0).all().all(), df[["client_id", *required]]
    # one line per request on each side within the cell's window
    assert (df["evidence_d_rdma_ready_ack"] == df["completed"]).all()
    preflight = json.loads((pd_run / "preflight.json").read_text())
    assert preflight["pd"]["pd"] == {"page_size": 64, "kv_cache_dtype": None}


def test_warmup_has_the_shape_of_the_first_listed_case(pd_run: Path) -> None:
    [warmup] = [f for _, e, f in read_events(pd_run / "orchestrator.log") if e == "warmup"]
    assert warmup["shape"] == "case~64-8-c1"
    # The RDMA endpoint set-up of the first request after the start (seed 003: 4.775 s TTFT)
    # is in the warm-up record, not in the 64-token smoke row that runs right after it.
    df = pd.read_csv(pd_run / "results.csv").set_index("client_id")
    assert float(warmup["ttft_ms"]) > df.loc["case~64-8-c1", "ttft_p50_ms"]


def test_cases_run_in_config_order_with_own_seeds_and_a_flushed_cache(pd_run: Path) -> None:
    events = read_events(pd_run / "orchestrator.log")
    started = [f["cell"].split("/")[1] for _, e, f in events if e == "cell-start"]
    exp = load_experiment_file(LOCAL_PD)
    assert started == [f"case~{name}" for name in exp.cases], "the 64-token smoke first"
    flushed = [f["cell"] for _, e, f in events if e == "flush-cache"]
    # the radix cache is on: flushed after the equivalence probe and before every cell
    assert flushed == ["pd/probe", *(f"pd/case~{name}/r1" for name in exp.cases)]
    df = pd.read_csv(pd_run / "results.csv")
    assert df["cache_flushed"].all()
    assert df["seed"].is_unique and 1 not in set(df["seed"])


def test_the_default_suite_is_the_seeds_four_standard_cases(tmp_path: Path) -> None:
    cfg = pd_config(tmp_path, "wf-pd-default")
    proc = run_snakemake(tmp_path, "-n", "--configfile", str(cfg))
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith(
        "servesweep plan: run wf-pd-default (suite standard: 4 of 6 cases, SUITE=all runs "
        "every case): 4 of 4 cell-repeats to run"
    ), line
    assert "case~16k-512-c1" not in proc.stdout


def test_suite_selection_plans_only_its_cases(tmp_path: Path) -> None:
    cfg = pd_config(tmp_path, "wf-pd-plan")
    proc = run_snakemake(tmp_path, "-n", "--configfile", str(cfg), env={"SUITE": "decode512-c8"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "case~16k-512-c8" in proc.stdout
    assert "case~16k-1-c8" not in proc.stdout


def _events(run_dir: Path) -> list[tuple[str, dict[str, str]]]:
    path = run_dir / "orchestrator.log"
    return [(e, f) for _, e, f in read_events(path)] if path.exists() else []


def test_up_then_three_suites_reuse_one_service_then_down(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Seed 003's flow: deploy once, run suites under their own RUN_IDs, stop at the end."""
    cfg = pd_config(tmp_path, "wf-pd-up")
    results = tmp_path / "results"
    args = ["--configfile", str(cfg), "--results", str(results)]
    fp = None
    try:
        assert cli(["up", *args]) == 0
        out = capsys.readouterr().out
        assert "started" in out
        fp = out.split()[1]
        # the first two runs up to their results.csv, the last one `all` (its analysis jobs and
        # the end of the workflow leave the service up too)
        for run_id, suite in (("a", "decode512"), ("b", "decode512-c8"), ("c", None)):
            env = {"RUN_ID": run_id} | ({"SUITE": suite} if suite else {})
            target = "all" if run_id == "c" else f"results/{run_id}/results.csv"
            proc = run_snakemake(
                tmp_path, "--cores", "1", target, "--configfile", str(cfg), env=env
            )
            assert proc.returncode == 0, proc.stderr[-4000:]
            events = _events(results / run_id)
            assert not [e for e, _ in events if e in ("start", "stop", "warmup")], events
            assert ("reuse", {"fp": fp, "server": "pd", "service": fp}) in events
            assert cli(["status", *args]) == 0  # the service is still up after each run
            rows = [r for r in capsys.readouterr().out.splitlines() if "mine=true" in r]
            assert len(rows) == 9 and all("running=True" in r for r in rows)
            assert all(f"service={fp}" in r for r in rows)
        assert sum("health=200" in r for r in rows) == 3  # prefill, decode rank 0 and router
        # every simulated GPU is held by the service, which preflight lets each run reuse
        gpus = json.loads((results / "a" / "preflight.json").read_text())["gpus"]
        assert gpus and all(g["held_by_ours"] for g in gpus), gpus
        assert all("used_by=wf-pd-up,a,b,c" in r for r in rows)
        [warmup] = [f for e, f in _events(results / "wf-pd-up") if e == "warmup"]
        assert warmup["shape"] == "case~64-8-c1"  # the first listed case, not the suite's
        up_events = [e for e, _ in _events(results / "wf-pd-up")]
        assert up_events.count("start") == 1 and up_events.count("warmup") == 1
        assert (results / "wf-pd-up" / "service" / "pd" / "warmup.jsonl").exists()
        warmups = list(results.glob("*/service/*/warmup.jsonl"))
        assert len(warmups) == 1, warmups
    finally:
        assert cli(["down", *args]) == 0
    exp = load_experiment_file(cfg)
    # This checkout's servers only: another checkout may run the same test (same run id) now.
    mine = {"run": exp.run_id, **current_owner(results).labels()}
    assert ProcessRuntime(LocalTransport()).find("p601", mine) == []
    assert not (results / ".services" / f"{fp}.json").exists()


def test_a_cell_without_its_required_evidence_is_invalid(tmp_path: Path) -> None:
    """A pattern the decode side never logs: the cell fails with one line naming it."""
    cfg = pd_config(
        tmp_path,
        "wf-pd-noevidence",
        evidence={"d_never": {"pattern": "no such line", "role": "decode"}},
        preflight={"dry_fire": False},  # else the dry fire finds the line missing first
    )
    raw = "results/wf-pd-noevidence/raw/pd/case~64-8-c1/r1.jsonl"
    proc = run_snakemake(tmp_path, "--cores", "1", raw, "--configfile", str(cfg))
    assert proc.returncode != 0
    reason = (
        "cell pd/case~64-8-c1/r1: invalid: log evidence below its minimum: "
        "d_never (decode logs, window cell): 0 < 1; logs: "
    )
    assert reason in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / raw).exists()


def test_pd_on_one_hosts_gpus_each_node_its_slice(tmp_path: Path) -> None:
    """Prefill on GPUs 0-1 and decode on 2-3 of one host (`cluster.gpu_ids`, the multi-GPU
    rehearsal's PD shape): each rank's command line sets its CUDA_VISIBLE_DEVICES, preflight
    passes with both on the host, and each node's GPU rows are only its own GPUs."""
    slices = {
        "cluster": {
            "nodes": ["p01", "d23"],
            "gpus_per_node": 2,
            "gpu_ids": {"p01": [0, 1], "d23": [2, 3]},
        },
        "roles": {
            "prefill": {"nodes": ["p01"], "server": {"pp_size": 1, "tp_size": 2, "ep_size": 2}},
            "decode": {"nodes": ["d23"], "server": {"tp_size": 2, "ep_size": 2}},
        },
        "router": {"node": "d23"},
        "suite": "one",
        "suites": {"one": ["64-8-c1"]},
        "reference": None,
    }
    run, commands = one_case_table(tmp_path, "wf-pd-slices", slices)
    assert "CUDA_VISIBLE_DEVICES=0,1" in commands and "CUDA_VISIBLE_DEVICES=2,3" in commands
    gpu = pd.concat(pd.read_csv(p) for p in run.glob("gpu/**/*.csv"))
    indices = gpu.dropna(subset=["index"]).groupby("node")["index"].unique()
    assert {node: sorted(ids) for node, ids in indices.items()} == {
        "p01": [0.0, 1.0],
        "d23": [2.0, 3.0],
    }


def test_pd_on_one_gpu_reads_the_shared_gpu_once(tmp_path: Path) -> None:
    """Prefill and decode on GPU 0 of one host (`cluster.gpu_ids` {p0: [0], d0: [0]}, the
    one-GPU rehearsal's shape): both ranks get CUDA_VISIBLE_DEVICES=0, preflight passes, the
    roles start one after another, and the GPU file holds GPU 0 once (under p0): one node's
    power, gpu_shared_by prefill+decode."""
    shared = {
        "cluster": {"nodes": ["p0", "d0"], "gpus_per_node": 1, "gpu_ids": {"p0": [0], "d0": [0]}},
        "roles": {
            "prefill": {
                "nodes": ["p0"],
                "server": {"pp_size": 1, "tp_size": 1, "ep_size": 1, "mem_fraction_static": 0.3},
            },
            "decode": {
                "nodes": ["d0"],
                "server": {"tp_size": 1, "ep_size": 1, "mem_fraction_static": 0.3},
            },
        },
        "router": {"node": "d0"},
        "suite": "one",
        "suites": {"one": ["64-8-c1"]},
        "reference": None,
    }
    run, commands = one_case_table(tmp_path, "wf-pd-one-gpu", shared)
    assert commands.count("CUDA_VISIBLE_DEVICES=0 ") == 2
    events = read_events(run / "orchestrator.log")
    ready = [(f["role"], f["wave"]) for _, kind, f in events if kind == "role-ready"]
    # roles sharing a GPU start one after another (their memory profiling would race)
    assert ready == [("prefill", "1"), ("decode", "2"), ("router", "3")]
    gpu = pd.concat(pd.read_csv(p) for p in run.glob("gpu/**/*.csv"))
    indices = gpu.dropna(subset=["index"]).groupby("node")["index"].unique()
    assert {node: sorted(ids) for node, ids in indices.items()} == {"p0": [0.0]}
    results = pd.read_csv(run / "results.csv")
    assert list(results["gpu_status"]) == ["simulated"]  # the sim's curve: no snapshot count
    assert results["gpu_node_power_w"].str.fullmatch(r"p0=[\d.]+/[\d.]+").all()
    assert list(results["gpu_shared_by"]) == ["prefill+decode"]


def test_a_router_without_workers_stops_the_run_and_its_log_says_why(tmp_path: Path) -> None:
    # issue 28: every worker circuit of the router open (the sim answers 503 with
    # sglang-router's Rust error line): the run stops at the first request through the router
    # (the warm-up), its log holds the 503; the router's log, read as a finished log, is fatal
    from servesweep.measure import checks

    cfg = pd_config(
        tmp_path,
        "wf-pd-no-workers",
        engine={"sim": {"faults": {"router_no_workers_after": 0}}},
        workload={"num_requests": 4},
        preflight={"dry_fire": False},  # the dry fire would meet the 503 first (its own test)
    )
    proc = run_snakemake(tmp_path, "--cores", "1", "all", "--configfile", str(cfg))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    service = tmp_path / "results" / "wf-pd-no-workers" / "service" / "pd"
    # the warm-up through the router is the first request: the run stops there, naming its log
    assert "cell pd/warmup: client exited 1" in out, out[-3000:]
    assert "bench log results/wf-pd-no-workers/service/pd/warmup.log" in out, out[-3000:]
    assert (
        "HTTP 503 Service Unavailable: No available workers" in (service / "warmup.log").read_text()
    )
    logs = sorted(service.glob("router-*.log"))
    assert len(logs) == 1, sorted(service.iterdir())
    verdict = checks.check_file(logs[0], kind="log")[0]
    assert verdict.verdict == "fatal" and "sglang_router_rs" in verdict.text
    runtime = ProcessRuntime(LocalTransport())
    assert runtime.find("local", {"run": "wf-pd-no-workers"}) == [], "no process is left"


# The landing page as the browser laid it out: its first section heading, the reference
# table's header cells and rows, and whether it opens on "No deltas".
PD_LANDING_PROBE = """() => {
  const prose = document.querySelector('#app .prose');
  const table = prose.querySelector('table#reference');
  return {first_h2: (prose.querySelector('h2') || {}).textContent,
          header: table ? [...table.querySelectorAll('thead th')].map(t => t.textContent) : [],
          rows: table ? table.querySelectorAll('tbody tr').length : 0,
          text: prose.innerText};
}"""


def test_the_pd_report_opens_on_the_reference_table_with_tpot_in_a_browser(
    pd_run: Path, tmp_path: Path
) -> None:
    """Issue 27: the PD landing page is the validation answer (each case against seed 003's
    reference, TTFT and TPOT), not "No deltas in this run" with the table in a submenu."""
    import os
    import shutil

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("SERVESWEEP_REQUIRE_BROWSER"):
            pytest.fail("chromium not found, and SERVESWEEP_REQUIRE_BROWSER is set")
        pytest.skip("chromium not found (apt-get install chromium)")
    workdir = pd_run.parents[1]
    report = tmp_path / "report.html"
    proc = run_snakemake(workdir, "--report", str(report), "--configfile", str(workdir / "pd.yaml"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(report.as_uri())
            page.wait_for_selector("#app .prose h1", timeout=60_000)
            found = page.evaluate(PD_LANDING_PROBE)
        finally:
            browser.close()
    assert found["first_h2"] == "Each case against the reference", found["first_h2"]
    assert found["rows"] == 6, found  # suite "all": every case of seed 003's table
    assert "TTFT P50 / P95" in found["header"] and "TPOT P50 / P95" in found["header"], found
    assert "No deltas in this run" not in found["text"]
    html = (pd_run / "report.html").read_text()
    assert html.index('id="reference"') < html.index("id='warnings'"), "report.html too"


def one_case_table(tmp_path: Path, run_id: str, changes: dict) -> tuple[Path, str]:
    """A one-case PD run of `changes` up to results.csv (preflight and the cell are what such a
    test checks, not the analysis): its run folder and its servers' commands.sh."""
    cfg = pd_config(tmp_path, run_id, **changes)
    raw = yaml.safe_load(cfg.read_text())
    del raw["evidence"]["p_state_slice_mode"]  # SGLang logs it only when P and D TP differ
    cfg.write_text(yaml.safe_dump(raw, sort_keys=False))
    table = f"results/{run_id}/results.csv"
    proc = run_snakemake(tmp_path, "--cores", "1", table, "--configfile", str(cfg))
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = tmp_path / "results" / run_id
    return run, (run / "service" / "pd" / "commands.sh").read_text()


def test_each_case_has_its_ttft_breakdown_from_both_roles_metrics(pd_run: Path) -> None:
    """Prefill's and decode's /metrics recorded per case (the router's answers 404: said once
    in the series' header); the TTFT split from their per-stage histograms in results.csv."""
    from servesweep.measure import servermetrics

    series = sorted(pd_run.glob("metrics/pd/case~*/r1.jsonl.gz"))
    assert len(series) == 6
    header = servermetrics.read_lines(series[0])[0]["header"]
    assert {t["role"] for t in header["targets"]} == {"prefill", "decode", "router"}
    assert len(header["notes"]) == 1 and "router" in header["notes"][0]
    assert "404" in header["notes"][0]
    df = pd.read_csv(pd_run / "results.csv")
    for part in ("bootstrap", "prefill", "transfer", "first_decode"):
        assert (df[f"ttft_{part}_ms"] > 0).all(), part
    assert (df["ttft_breakdown_ms"] > 0).all()
    # The sim's HTTP hops (router, prefill's answer, decode's long poll) are real wall time
    # against its scaled compute: the breakdown holds 56-92% of the client's mean TTFT here.
    streamed = df["client_id"] != "case~1k-16-c1-nonstream"
    errors = df.loc[streamed, "ttft_breakdown_error_pct"]
    assert errors.between(-50, 5).all(), errors.tolist()
    assert df.loc[~streamed, "ttft_breakdown_error_pct"].isna().all(), "TTFT = whole latency"
    assert (pd_run / "plots" / "ttft_breakdown.png").stat().st_size > 0  # the stacked bars
    assert (pd_run / "plots" / "server_series.png").stat().st_size > 0
