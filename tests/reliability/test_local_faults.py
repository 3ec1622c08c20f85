"""Faults on this machine (process runtime): every failure stops cleanly, loses nothing, leaves
nothing running, and a rerun after the cause is removed runs only the missing cells."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pytest
import yaml

from tests.reliability.harness import (
    ACROSS,
    SECOND_CELL_INDEX,
    TARGET,
    WITHIN,
    Checks,
    FaultShim,
    Run,
    check_rank1_dies,
    check_rerun_after_sigkill,
    check_stopped_cleanly,
    fill,
    kill_group,
    local_leftovers,
    log_paths,
    output,
    rerun_and_check,
    run_during_hang,
    sigkill_mid_cell,
    small_filesystem,
)

pytestmark = [pytest.mark.reliability, pytest.mark.workflow]


@dataclass(frozen=True)
class ShimFault:
    """A fault the shim arms for the target's server config: the run stops at it, and the rerun
    after `shim.clear()` runs only the missing cells."""

    id: str  # the test id; docs/reliability.md orders its rows by it
    title: str  # checks.scenario
    fault: str  # the sim's extra flags (`@fatal TEXT`: a log line once ready)
    cause: str  # a regex the error line matches
    matrix: Mapping[str, Any]  # ACROSS: the second server config fails; WITHIN: its second cell
    finished: int = 1  # cells finished before the fault


FAULT_THEN_RERUN = [
    ShimFault(
        "server_fails_to_start",
        "server fails to start (CUDA OOM while loading, process exits)",
        "--sim-fail-start",
        r"ServerStartError: .*(fatal pattern|exited)",
        ACROSS,
    ),
    ShimFault(
        "server_never_becomes_ready",
        "server never becomes ready (engine.ready_timeout_s passes)",
        "--sim-startup-s 1000000",
        r"ServerStartError: .*not ready after \d+s",
        ACROSS,
    ),
    ShimFault(
        "server_crashes_mid_cell",
        "server crashes mid-cell (CUDA error in the scheduler, process exits)",
        f"--sim-crash-after {SECOND_CELL_INDEX}",
        r"ServerDied: .*(fatal pattern|exited)",
        WITHIN,
    ),
    ShimFault(  # issue 28: SGLang's other processes and the native libraries it hosts
        "another_process_crashes_mid_cell",
        "another process crashes mid-cell (the detokenizer's crash header, process exits)",
        f"--sim-crash-after {SECOND_CELL_INDEX} --sim-crash-kind detokenizer",
        r"ServerDied: .*(fatal pattern 'process_exception'|exited)",
        WITHIN,
    ),
    ShimFault(
        "native_library_crashes_mid_cell",
        "a native library crashes mid-cell (UCX Caught signal 11, the process dies of SIGSEGV)",
        f"--sim-crash-after {SECOND_CELL_INDEX} --sim-crash-kind native",
        r"ServerDied: .*(fatal pattern 'native_crash'|exited)",
        WITHIN,
    ),
    ShimFault(
        "some_requests_get_http_500",
        "some requests get HTTP 500",
        f"--sim-http-500-at {SECOND_CELL_INDEX}",
        r"CellFailed: .*HTTP 500",
        WITHIN,
    ),
    ShimFault(
        "mid_stream_error",
        'mid-stream error (HTTP 200, then `data: {"error": ...}`)',
        f"--sim-midstream-error-at {SECOND_CELL_INDEX}",
        r"CellFailed: .*request\(s\) failed.*error",
        WITHIN,
    ),
    ShimFault(
        "server_hangs_client_times_out",
        "the server hangs (workload.request_timeout_s passes in the client)",
        f"--sim-hang-at {SECOND_CELL_INDEX}",
        r"CellFailed: .*TimeoutError",
        WITHIN,
    ),
    ShimFault(
        "fatal_pattern_in_a_log",
        "a fatal pattern in a server log while the process keeps serving",
        "@fatal [2026-01-01 00:00:00 TP3] NCCL error: unhandled system error",
        r"(ServerDied|ServerStartError): .*fatal pattern 'nccl_error'",
        ACROSS,
    ),
]


@pytest.mark.parametrize("scenario", FAULT_THEN_RERUN, ids=lambda s: s.id)
def test_fault_then_rerun(
    scenario: ShimFault,
    checks: Checks,
    make_run: Callable[..., Run],
    shim: FaultShim,
    reference: pd.DataFrame,
) -> None:
    checks.scenario(scenario.title)
    shim.inject(TARGET, scenario.fault)
    run = make_run(scenario.matrix)
    check_stopped_cleanly(
        checks, run, run.snakemake(), cause=scenario.cause, finished=scenario.finished
    )
    rerun_and_check(checks, run, reference, remove_cause=shim.clear)


def test_disk_fills_while_writing_a_raw_file(
    checks: Checks, make_run: Callable[..., Run], reference: pd.DataFrame
) -> None:
    checks.scenario("the disk fills while writing a raw file (ENOSPC)")
    run = make_run(ACROSS)
    victim = run.raw(run.cells[-1]).parent
    with small_filesystem(victim) as mount:
        filler = fill(mount)
        proc = run.snakemake()
        check_stopped_cleanly(
            checks,
            run,
            proc,
            cause=r"OSError: .*No space left on device",
            node=r"workflow host",
            finished=1,
        )
        checks.check(
            "the full filesystem holds no partial raw file",
            sorted(p.name for p in mount.iterdir()) == [filler.name],
            str(list(mount.iterdir())),
        )
        rerun_and_check(checks, run, reference, remove_cause=filler.unlink)


def test_snakemake_gets_sigint(
    checks: Checks, make_run: Callable[..., Run], shim: FaultShim, reference: pd.DataFrame
) -> None:
    checks.scenario("snakemake gets SIGINT (Ctrl-C) mid-cell")
    run = make_run(WITHIN)
    proc = run_during_hang(run, shim, lambda p: kill_group(p, signal.SIGINT))
    check_stopped_cleanly(checks, run, proc, cause=r"Interrupted|KeyboardInterrupt", finished=1)
    events = [e for _, e, _ in run.events()]
    checks.check("onerror stopped the server (last event `stop`)", events[-1] == "stop", events)
    rerun_and_check(checks, run, reference)


def test_sigint_to_a_run_started_in_the_background(
    checks: Checks, make_run: Callable[..., Run], shim: FaultShim, reference: pd.DataFrame
) -> None:
    checks.scenario(
        "SIGINT to the process group of a snakemake started in a script's background (`cmd &`: "
        "SIGINT ignored, only the cell's client ends on it) mid-cell: an interruption, not "
        "'ClientError: client exited 143'"
    )
    run = make_run(WITHIN)
    proc = run_during_hang(run, shim, lambda p: kill_group(p, signal.SIGINT), sigint_ignored=True)
    line = check_stopped_cleanly(checks, run, proc, cause=r"Interrupted: .*SIGINT", finished=1)
    checks.check("no ClientError is reported", "ClientError" not in output(proc), line)
    events = [e for _, e, _ in run.events()]
    checks.check("onerror stopped the server (last event `stop`)", events[-1] == "stop", events)
    rerun_and_check(checks, run, reference)


def test_snakemake_is_sigkilled_then_rerun(
    checks: Checks, make_run: Callable[..., Run], shim: FaultShim, reference: pd.DataFrame
) -> None:
    checks.scenario("snakemake is SIGKILLed mid-cell, then rerun")
    run = make_run(WITHIN)
    sigkill_mid_cell(checks, run, shim)
    stale = local_leftovers(run.port)
    checks.check("the server outlives snakemake (no handler runs on SIGKILL)", bool(stale))
    check_rerun_after_sigkill(checks, run, reference)


def test_rank_above_zero_dies_mid_cell(
    checks: Checks, make_run: Callable[..., Run], shim: FaultShim, reference: pd.DataFrame
) -> None:
    checks.scenario("a rank > 0 node dies mid-cell (two local nodes, rank 1 killed)")
    run = make_run(WITHIN, cluster={"nodes": ["local", "local2"], "gpus_per_node": 4})

    def kill_rank1(_: subprocess.Popen[str]) -> None:
        state = json.loads((run.run_dir / "service" / "current.json").read_text())
        rank1 = next(r for r in state["ranks"] if r["rank"] == 1)
        os.killpg(int(rank1["handle"]), signal.SIGKILL)

    check_rank1_dies(
        checks, run, shim, reference, kill_rank1=kill_rank1, node=r"node local2?\b", died="local2"
    )


def test_failed_server_log_survives_the_rerun(
    checks: Checks, make_run: Callable[..., Run], shim: FaultShim, reference: pd.DataFrame
) -> None:
    checks.scenario("the log named by a failure is still there after the rerun")
    run = make_run(WITHIN)
    shim.inject(TARGET, f"--sim-crash-after {SECOND_CELL_INDEX}")
    evidence = "injected by --sim-crash-after"
    line = check_stopped_cleanly(checks, run, run.snakemake(), cause=r"ServerDied: ", finished=1)
    named = [run.workdir / p for p in log_paths(line) if "/service/" in p]
    checks.check(
        "the server log named in the error holds the crash",
        any(evidence in p.read_text() for p in named if p.exists()),
        str(named),
    )
    rerun_and_check(checks, run, reference, remove_cause=shim.clear)
    service = run.server_log(TARGET).parent
    kept = [p for p in service.rglob("*.log*") if evidence in p.read_text(errors="replace")]
    listing = str(sorted(p.name for p in service.iterdir()))
    checks.check("the crash's server log survives the rerun's start", bool(kept), listing)


def test_fault_removed_from_the_config_reruns_only_missing_cells(
    checks: Checks, make_run: Callable[..., Run], reference: pd.DataFrame
) -> None:
    checks.scenario("a fault set in the config (engine.sim.faults), then removed from it")
    run = make_run(WITHIN)
    config = yaml.safe_load(run.config.read_text())
    faulty = copy.deepcopy(config)
    faulty["engine"]["sim"]["faults"] = {"http_500_at": [SECOND_CELL_INDEX]}
    run.config.write_text(yaml.safe_dump(faulty, sort_keys=False))
    check_stopped_cleanly(checks, run, run.snakemake(), cause=r"CellFailed: .*HTTP 500", finished=1)

    def remove_fault() -> None:
        run.config.write_text(yaml.safe_dump(config, sort_keys=False))

    rerun_and_check(checks, run, reference, remove_cause=remove_fault)


def test_narrowed_run_then_the_full_matrix(
    checks: Checks, make_run: Callable[..., Run], reference: pd.DataFrame
) -> None:
    checks.scenario("a run cut short by env narrowing, then the full matrix (results.csv target)")
    run = make_run(ACROSS)
    table = f"results/{run.run_id}/results.csv"
    first = run.snakemake("--cores", "1", table, env={"BACKENDS_CSV": "marlin"})
    checks.check("the narrowed run succeeds", first.returncode == 0, output(first)[-3000:])
    before, n_events = run.finished(), len(run.events())
    checks.check("the narrowed run finished its cell", len(before) == 1, str(before))
    rerun = run.snakemake("--cores", "1", table)
    checks.check("the full run succeeds", rerun.returncode == 0, output(rerun)[-3000:])
    ran = [f["cell"] for _, e, f in run.events()[n_events:] if e == "cell-start"]
    missing = [c for c in run.cells if c not in before]
    rows = len(pd.read_csv(run.run_dir / "results.csv"))
    checks.check(
        "results.csv of the full matrix runs the missing cell and has every cell",
        sorted(ran) == sorted(missing) and rows == len(run.cells),
        f"ran {ran}, missing {missing}, {rows} row(s) in results.csv",
    )
    checks.finish()
