"""Faults on this machine (process runtime): every failure stops cleanly, loses nothing, leaves
nothing running, and a rerun after the cause is removed runs only the missing cells."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable

import pandas as pd
import pytest
import yaml

from tests.reliability.harness import (
    ACROSS,
    HANG_MARKER,
    SECOND_CELL_INDEX,
    SNAKEMAKE_TIMEOUT_S,
    TARGET,
    WITHIN,
    Checks,
    FaultShim,
    Run,
    check_rerun,
    check_stopped_cleanly,
    error_lines,
    file_contains,
    fill,
    kill_group,
    local_leftovers,
    log_paths,
    output,
    rerun_after_sigkill,
    small_filesystem,
    wait_for,
)

pytestmark = [pytest.mark.reliability, pytest.mark.workflow]


def _fault_then_rerun(
    checks: Checks,
    run: Run,
    shim: FaultShim,
    reference: pd.DataFrame,
    *,
    cause: str,
    finished: int,
) -> str:
    """Run with the armed shim, check the failure, clear the cause, rerun, check the results."""
    proc = run.snakemake()
    line = check_stopped_cleanly(
        checks,
        run,
        output(proc),
        proc.returncode,
        cause=cause,
        finished=finished,
    )
    before, n_events = run.finished(), len(run.events())
    shim.clear()
    check_rerun(checks, run, before, n_events, run.snakemake(), reference)
    return line


def test_server_fails_to_start(
    checks: Checks, make_run: Callable[..., Run], shim: FaultShim, reference: pd.DataFrame
) -> None:
    checks.scenario("server fails to start (CUDA OOM while loading, process exits)")
    shim.inject(TARGET, "--sim-fail-start")
    _fault_then_rerun(
        checks,
        make_run(ACROSS),
        shim,
        reference,
        cause=r"ServerStartError: .*(fatal pattern|exited)",
        finished=1,
    )


def test_server_never_becomes_ready(
    checks: Checks, make_run: Callable[..., Run], shim: FaultShim, reference: pd.DataFrame
) -> None:
    checks.scenario("server never becomes ready (engine.ready_timeout_s passes)")
    shim.inject(TARGET, "--sim-startup-s 1000000")
    _fault_then_rerun(
        checks,
        make_run(ACROSS),
        shim,
        reference,
        cause=r"ServerStartError: .*not ready after \d+s",
        finished=1,
    )


def test_server_crashes_mid_cell(
    checks: Checks, make_run: Callable[..., Run], shim: FaultShim, reference: pd.DataFrame
) -> None:
    checks.scenario("server crashes mid-cell (CUDA error in the scheduler, process exits)")
    shim.inject(TARGET, f"--sim-crash-after {SECOND_CELL_INDEX}")
    _fault_then_rerun(
        checks,
        make_run(WITHIN),
        shim,
        reference,
        cause=r"ServerDied: .*(fatal pattern|exited)",
        finished=1,
    )


def test_some_requests_get_http_500(
    checks: Checks, make_run: Callable[..., Run], shim: FaultShim, reference: pd.DataFrame
) -> None:
    checks.scenario("some requests get HTTP 500")
    shim.inject(TARGET, f"--sim-http-500-at {SECOND_CELL_INDEX}")
    _fault_then_rerun(
        checks,
        make_run(WITHIN),
        shim,
        reference,
        cause=r"CellFailed: .*HTTP 500",
        finished=1,
    )


def test_mid_stream_error(
    checks: Checks, make_run: Callable[..., Run], shim: FaultShim, reference: pd.DataFrame
) -> None:
    checks.scenario('mid-stream error (HTTP 200, then `data: {"error": ...}`)')
    shim.inject(TARGET, f"--sim-midstream-error-at {SECOND_CELL_INDEX}")
    _fault_then_rerun(
        checks,
        make_run(WITHIN),
        shim,
        reference,
        cause=r"CellFailed: .*request\(s\) failed.*error",
        finished=1,
    )


def test_server_hangs_client_times_out(
    checks: Checks, make_run: Callable[..., Run], shim: FaultShim, reference: pd.DataFrame
) -> None:
    checks.scenario("the server hangs (workload.request_timeout_s passes in the client)")
    shim.inject(TARGET, f"--sim-hang-at {SECOND_CELL_INDEX}")
    _fault_then_rerun(
        checks,
        make_run(WITHIN),
        shim,
        reference,
        cause=r"CellFailed: .*TimeoutError",
        finished=1,
    )


def test_fatal_pattern_in_a_log(
    checks: Checks, make_run: Callable[..., Run], shim: FaultShim, reference: pd.DataFrame
) -> None:
    checks.scenario("a fatal pattern in a server log while the process keeps serving")
    shim.inject(TARGET, "@fatal [2026-01-01 00:00:00 TP3] NCCL error: unhandled system error")
    _fault_then_rerun(
        checks,
        make_run(ACROSS),
        shim,
        reference,
        cause=r"(ServerDied|ServerStartError): .*fatal pattern 'nccl_error'",
        finished=1,
    )


def test_disk_fills_while_writing_a_raw_file(
    checks: Checks, make_run: Callable[..., Run], shim: FaultShim, reference: pd.DataFrame
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
            output(proc),
            proc.returncode,
            cause=r"OSError: .*No space left on device",
            node=r"workflow host",
            finished=1,
        )
        checks.check(
            "the full filesystem holds no partial raw file",
            sorted(p.name for p in mount.iterdir()) == [filler.name],
            str(list(mount.iterdir())),
        )
        before, n_events = run.finished(), len(run.events())
        filler.unlink()
        check_rerun(checks, run, before, n_events, run.snakemake(), reference)


def _interrupt_mid_cell(run: Run, shim: FaultShim, sig: signal.Signals) -> tuple[int, str]:
    """Start the run, wait until the second cell waits on a request that never gets an answer
    (a window of request_timeout_s), then signal snakemake's process group."""
    shim.inject(TARGET, f"--sim-hang-at {SECOND_CELL_INDEX}")
    proc = run.start()
    try:
        wait_for(
            file_contains(run.server_log(TARGET), HANG_MARKER),
            what=f"request #{SECOND_CELL_INDEX} to hang",
        )
        kill_group(proc, sig)
        out, err = proc.communicate(timeout=SNAKEMAKE_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            kill_group(proc, signal.SIGKILL)
            proc.communicate()
    shim.clear()
    return proc.returncode, out + err


def test_snakemake_gets_sigint(
    checks: Checks, make_run: Callable[..., Run], shim: FaultShim, reference: pd.DataFrame
) -> None:
    checks.scenario("snakemake gets SIGINT (Ctrl-C) mid-cell")
    run = make_run(WITHIN)
    returncode, text = _interrupt_mid_cell(run, shim, signal.SIGINT)
    check_stopped_cleanly(
        checks, run, text, returncode, cause=r"Interrupted|KeyboardInterrupt", finished=1
    )
    events = [e for _, e, _ in run.events()]
    checks.check("onerror stopped the server (last event `stop`)", events[-1] == "stop", events)
    before, n_events = run.finished(), len(run.events())
    check_rerun(checks, run, before, n_events, run.snakemake(), reference)


def test_snakemake_is_sigkilled_then_rerun(
    checks: Checks, make_run: Callable[..., Run], shim: FaultShim, reference: pd.DataFrame
) -> None:
    checks.scenario("snakemake is SIGKILLed mid-cell, then rerun")
    run = make_run(WITHIN)
    returncode, _ = _interrupt_mid_cell(run, shim, signal.SIGKILL)
    checks.check("snakemake died of SIGKILL", returncode == -signal.SIGKILL, str(returncode))
    stale = local_leftovers(run.port)
    checks.check("the server outlives snakemake (no handler runs on SIGKILL)", bool(stale))
    before, n_events = run.finished(), len(run.events())
    checks.check("the finished cell is kept", len(before) == 1, str(before))
    rerun = rerun_after_sigkill(checks, run)
    rerun_events = run.events()[n_events:]
    handled = [e for _, e, _ in rerun_events if e in ("reuse", "stale", "unhealthy")]
    checks.check(
        "the rerun found the stale server (reused if healthy, else removed by label)",
        bool(handled),
        str(rerun_events),
    )
    check_rerun(checks, run, before, n_events, rerun, reference)


def test_rank_above_zero_dies_mid_cell(
    checks: Checks, make_run: Callable[..., Run], shim: FaultShim, reference: pd.DataFrame
) -> None:
    checks.scenario("a rank > 0 node dies mid-cell (two local nodes, rank 1 killed)")
    run = make_run(WITHIN, cluster={"nodes": ["local", "local2"], "gpus_per_node": 4})
    shim.inject(TARGET, f"--sim-hang-at {SECOND_CELL_INDEX}")
    proc = run.start()
    try:
        wait_for(file_contains(run.server_log(TARGET), HANG_MARKER), what="the hang window")
        state = json.loads((run.run_dir / "service" / "current.json").read_text())
        rank1 = next(r for r in state["ranks"] if r["rank"] == 1)
        os.killpg(int(rank1["handle"]), signal.SIGKILL)
        out, err = proc.communicate(timeout=SNAKEMAKE_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            kill_group(proc, signal.SIGKILL)
            proc.communicate()
    shim.clear()
    check_stopped_cleanly(
        checks,
        run,
        out + err,
        proc.returncode,
        cause=r"ServerDied: .*(exited|nccl|fatal pattern)",
        node=r"node local2?\b",
        finished=1,
    )
    line = error_lines(out + err)[0]
    before, n_events = run.finished(), len(run.events())
    check_rerun(checks, run, before, n_events, run.snakemake(), reference)
    checks.check("the error names the node that died (local2)", "node local2" in line, line)
    checks.finish()


def test_failed_server_log_survives_the_rerun(
    checks: Checks, make_run: Callable[..., Run], shim: FaultShim, reference: pd.DataFrame
) -> None:
    checks.scenario("the log named by a failure is still there after the rerun")
    run = make_run(WITHIN)
    shim.inject(TARGET, f"--sim-crash-after {SECOND_CELL_INDEX}")
    proc = run.snakemake()
    evidence = "injected by --sim-crash-after"
    line = check_stopped_cleanly(
        checks, run, output(proc), proc.returncode, cause=r"ServerDied: ", finished=1
    )
    named = [run.workdir / p for p in log_paths(line) if "/service/" in p]
    checks.check(
        "the server log named in the error holds the crash",
        any(evidence in p.read_text() for p in named if p.exists()),
        str(named),
    )
    before, n_events = run.finished(), len(run.events())
    shim.clear()
    check_rerun(checks, run, before, n_events, run.snakemake(), reference)
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
    faulty = json.loads(json.dumps(config))
    faulty["engine"]["sim"]["faults"] = {"http_500_at": [SECOND_CELL_INDEX]}
    run.config.write_text(yaml.safe_dump(faulty, sort_keys=False))
    proc = run.snakemake()
    check_stopped_cleanly(
        checks, run, output(proc), proc.returncode, cause=r"CellFailed: .*HTTP 500", finished=1
    )
    before, n_events = run.finished(), len(run.events())
    run.config.write_text(yaml.safe_dump(config, sort_keys=False))
    check_rerun(checks, run, before, n_events, run.snakemake(), reference)


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
