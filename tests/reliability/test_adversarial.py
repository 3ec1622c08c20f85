"""Holes an adversarial run found (issue 40): a log line, a record, a clock or a config that
misleads the workflow. Each runs the real workflow against the sim with the fault armed outside
the config, then checks what the run said and what it kept."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import pandas as pd
import pytest
import yaml

from tests.reliability.harness import (
    ACROSS,
    TARGET,
    WITHIN,
    Checks,
    FaultShim,
    Run,
    check_stopped_cleanly,
    error_lines,
    output,
    rerun_and_check,
    server_id,
    stable,
)

pytestmark = [pytest.mark.reliability, pytest.mark.workflow]

# A real uvicorn access line's shape (SGLang 0.5.17 on the H200 rehearsal), its request target
# named like a fatal line: a client asked for a path that does not exist.
ACCESS_404 = (
    '[2026-12-02 05:50:51] INFO:     127.0.0.1:32816 - "GET /torch.OutOfMemoryError HTTP/1.1" '
    "404 Not Found"
)
# A fatal line with one byte that is no UTF-8 in it (\udcff: the byte 0xff, FaultShim.inject).
INVALID_BYTE_FATAL = "[2026-01-01 00:00:00 TP3] \udcff NCCL error: unhandled system error"


def test_a_request_path_named_like_a_fatal_line_fails_no_cell(
    checks: Checks, make_run: Callable[..., Run], shim: FaultShim, reference: pd.DataFrame
) -> None:
    checks.scenario(
        "a client requests `GET /torch.OutOfMemoryError` (404) from a healthy server: its "
        "access line is no fatal pattern, every cell is measured"
    )
    shim.inject(TARGET, f"@fatal {ACCESS_404}")
    run = make_run(ACROSS)
    proc = run.snakemake()
    checks.check("the run succeeds", proc.returncode == 0, output(proc)[-3000:])
    log = run.server_log(TARGET).read_text(errors="replace")
    checks.check("the server's log holds the access line", "/torch.OutOfMemoryError" in log)
    checks.check(
        "every cell is measured", sorted(run.finished()) == sorted(run.cells), str(run.finished())
    )
    got = stable(pd.read_csv(run.run_dir / "results.csv"))
    want = stable(reference[reference["client_id"] == got["client_id"].iloc[0]])
    checks.check("results.csv equals an uninterrupted run's", got.equals(want), f"{got}\n{want}")
    checks.check("nothing is left running", not run.leftovers(), str(run.leftovers()))


def test_an_invalid_utf8_byte_in_a_server_log(
    checks: Checks, make_run: Callable[..., Run], shim: FaultShim, reference: pd.DataFrame
) -> None:
    checks.scenario(
        "a server log gets a fatal line holding one byte that is no UTF-8 (0xff): the cell "
        "stops with the finding named, onerror stops the server"
    )
    shim.inject(TARGET, f"@fatal {INVALID_BYTE_FATAL}")
    run = make_run(ACROSS)
    proc = run.snakemake()
    check_stopped_cleanly(
        checks,
        run,
        proc,
        cause=r"(ServerDied|ServerStartError): .*fatal pattern 'nccl_error'",
        finished=1,
    )
    checks.check(
        "no UnicodeDecodeError anywhere", "UnicodeDecodeError" not in output(proc), output(proc)
    )
    events = [e for _, e, _ in run.events()]
    failed = max(i for i, e in enumerate(events) if e in ("start-failed", "cell-failed"))
    checks.check("the server was stopped after the failure", "stop" in events[failed:], events)
    rerun_and_check(checks, run, reference, remove_cause=shim.clear)


def _finished(checks: Checks, make_run: Callable[..., Run], **extra: object) -> Run:
    """A run of the ACROSS slice that went through once."""
    run = make_run(ACROSS, **extra)
    first = run.snakemake()
    checks.check("the first run succeeds", first.returncode == 0, output(first)[-3000:])
    return run


def _reruns_alone(checks: Checks, run: Run, cell: str) -> None:
    n_events = len(run.events())
    proc = run.snakemake()
    checks.check("the rerun succeeds", proc.returncode == 0, output(proc)[-3000:])
    checks.check("it runs that cell alone", run.started(n_events) == [cell], run.started(n_events))


def test_record_figures_its_arrays_contradict(checks: Checks, make_run: Callable[..., Run]) -> None:
    checks.scenario(
        "a finished raw record edited: its p99 TTFT halved and its output throughput raised "
        "10%, its per-request arrays kept; re-aggregated, then `servesweep import`ed"
    )
    run = _finished(checks, make_run)
    cell = run.cells[0]
    raw = run.raw(cell)
    record = json.loads(raw.read_text())
    forged = {
        **record,
        "p99_ttft_ms": record["p99_ttft_ms"] / 2,
        "output_throughput": record["output_throughput"] * 1.1,
    }
    raw.write_text(json.dumps(forged) + "\n")
    proc = run.snakemake()
    checks.check("re-aggregation exits non-zero", proc.returncode != 0, output(proc)[-3000:])
    lines = error_lines(output(proc))
    checks.check("a one-line `servesweep: <Kind>: ...` error", bool(lines), output(proc)[-3000:])
    line = lines[0]
    checks.message(line)
    checks.check(
        "it names the cell, both figures and says to delete the file",
        cell in line
        and "p99_ttft_ms" in line
        and "output_throughput" in line
        and "contradicts" in line
        and f"delete {raw.relative_to(run.workdir)}" in line,
        line,
    )
    source = run.workdir / "forged"
    source.mkdir()
    (source / "a.jsonl").write_text(json.dumps(forged) + "\n")
    argv = [sys.executable, "-m", "servesweep.workflow.cli", "import", str(source)]
    argv += ["--run-id", "imp", "--no-plots", "--results", str(run.workdir / "results")]
    imp = subprocess.run(argv, capture_output=True, text=True, env=run.full_env(), timeout=120)
    said = [x for x in output(imp).splitlines() if "p99_ttft_ms" in x]
    checks.check(
        "`servesweep import` refuses it (non-zero exit), naming the figures",
        imp.returncode != 0 and bool(said) and "output_throughput" in said[0],
        output(imp)[-2000:],
    )
    checks.message(said[0][:300])
    raw.unlink()
    _reruns_alone(checks, run, cell)


def test_a_node_clock_that_cannot_be_read(checks: Checks, make_run: Callable[..., Run]) -> None:
    checks.scenario(
        "a finished GPU file as a node leaves it whose `date` failed: its samples measured "
        "(nvidia-smi, the node's clock), its clock row `unavailable`; re-aggregated: "
        "`clock-unmeasured` with blank energy, never `ok` with the offset taken as 0"
    )
    run = _finished(checks, make_run)
    cell = run.cells[0]
    gpu = run.gpu(cell)
    frame = pd.read_csv(gpu, dtype=str, keep_default_na=False)
    samples, clock = frame["phase"] == "sample", frame["phase"] == "clock"
    checks.check("the file has samples and a clock row", samples.any() and clock.any())
    frame.loc[samples, "status"] = "ok"
    frame.loc[clock, "status"] = "unavailable"
    frame.loc[clock, "clock_offset_s"] = ""
    frame.loc[clock, "detail"] = "cannot read the clock of node local: date: invalid date"
    frame.to_csv(gpu, index=False)
    proc = run.snakemake()
    checks.check("re-aggregation succeeds", proc.returncode == 0, output(proc)[-3000:])
    df = pd.read_csv(run.run_dir / "results.csv")
    row = df.loc[df["server_id"] == cell.split("/")[0]].iloc[0]
    checks.check(
        "its gpu_status is `clock-unmeasured`",
        row["gpu_status"] == "clock-unmeasured",
        str(row["gpu_status"]),
    )
    checks.check(
        "its energy and power are blank, not figures of samples placed at offset 0",
        pd.isna(row["gpu_energy_j"]) and pd.isna(row["gpu_power_mean_w"]),
        str(row[["gpu_energy_j", "gpu_power_mean_w"]].to_dict()),
    )
    other = df.loc[df["server_id"] != cell.split("/")[0]].iloc[0]
    checks.check("the other cell keeps its figures", not pd.isna(other["gpu_energy_j"]))
    log = (run.run_dir / "logs" / "collect_results.log").read_text()
    said = [ln for ln in log.splitlines() if "clock could not be read" in ln]
    checks.check("the log names the node and why", bool(said) and "node local" in said[0], log)
    checks.message(said[0].split(" WARNING ", 1)[-1])
    gpu.unlink()
    _reruns_alone(checks, run, cell)


def test_an_unsliced_node_overlapping_a_slice_of_its_host(
    checks: Checks, make_run: Callable[..., Run]
) -> None:
    checks.scenario(
        "two nodes of one host, `local2` given GPUs 2-5 by cluster.gpu_ids, `local` none (GPUs "
        "0-3 of its host): refused in one line before anything starts; with GPUs 4-7 the run "
        "goes and each node's ranks see only their GPUs"
    )
    cluster = {"nodes": ["local", "local2"], "gpus_per_node": 4}
    run = make_run(WITHIN, cluster={**cluster, "gpu_ids": {"local2": [2, 3, 4, 5]}})
    proc = run.snakemake()
    text = output(proc)
    checks.check("the run exits non-zero", proc.returncode != 0, text[-3000:])
    refused = [x for x in text.splitlines() if "cluster.gpu_ids.local2" in x]
    checks.check(
        "one line names the key, the GPU and the node without an entry",
        bool(refused) and "node local has no gpu_ids entry" in refused[0],
        text[-3000:],
    )
    checks.message(refused[0].strip())
    checks.check("nothing started", not (run.run_dir / "orchestrator.log").exists())
    checks.check("nothing is left running", not run.leftovers(), str(run.leftovers()))
    raw = yaml.safe_load(run.config.read_text())
    raw["cluster"]["gpu_ids"]["local2"] = [4, 5, 6, 7]
    run.config.write_text(yaml.safe_dump(raw))
    proc = run.snakemake()
    checks.check("the run succeeds", proc.returncode == 0, output(proc)[-3000:])
    commands = (run.run_dir / "service" / server_id(TARGET) / "commands.sh").read_text()
    checks.check(
        "node local's rank sees GPUs 0-3, local2's 4-7 (CUDA_VISIBLE_DEVICES)",
        "CUDA_VISIBLE_DEVICES=0,1,2,3" in commands and "CUDA_VISIBLE_DEVICES=4,5,6,7" in commands,
        commands[-3000:],
    )
    checks.check("nothing is left running", not run.leftovers(), str(run.leftovers()))
