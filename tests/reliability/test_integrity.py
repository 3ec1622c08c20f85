"""Data integrity (issue 17): a record counts only if it was measured alone, with the
configuration it claims, and cleanup never touches a process that is not ours."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from tests.reliability.harness import (
    REQUESTS,
    SECOND_CELL_INDEX,
    SNAKEMAKE_TIMEOUT_S,
    TARGET,
    WITHIN,
    Checks,
    FaultShim,
    Run,
    check_rerun,
    descendants,
    hang_started,
    kill_group,
    rerun_unlocked,
    wait_for,
)

pytestmark = [pytest.mark.reliability, pytest.mark.workflow]

# Long enough that the killed cell's client still waits on its hung request when the rerun's
# cell starts (the rerun removes it long before).
LONG_REQUEST_TIMEOUT_S = 300


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_snakemake_and_cell_job_sigkilled_client_left(
    checks: Checks, make_run: Callable[..., Run], shim: FaultShim, reference: pd.DataFrame
) -> None:
    checks.scenario(
        "snakemake and the cell's job are SIGKILLed (the OOM killer), the load client keeps "
        "running; `--unlock` and rerun: the cell is measured alone"
    )
    workload = {
        "input_len": 512,
        "output_len": 4,
        "num_requests": REQUESTS,
        "request_timeout_s": LONG_REQUEST_TIMEOUT_S,
    }
    run = make_run(WITHIN, workload=workload)
    shim.inject(TARGET, f"--sim-hang-at {SECOND_CELL_INDEX}")
    proc = run.start()
    clients: list[int] = []
    try:
        wait_for(hang_started(run), limit_s=120, what=f"request #{SECOND_CELL_INDEX} to hang")
        tree = descendants(proc.pid)
        jobs = [p for p in tree if "run_cell" in _cmdline(p) and "loadgen" not in _cmdline(p)]
        clients = [p for p in tree if "servesweep.loadgen" in _cmdline(p)]
        checks.check("the cell's job and its client run", bool(jobs and clients), str(tree))
        for pid in [proc.pid, *jobs]:  # snakemake and the job alone, not their group
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.communicate(timeout=SNAKEMAKE_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            kill_group(proc, signal.SIGKILL)
            proc.communicate()
    shim.clear()
    checks.check(
        "the killed cell's client keeps running", any(_alive(p) for p in clients), str(clients)
    )
    before, n_events = run.finished(), len(run.events())
    checks.check("the finished cell is kept", len(before) == 1, str(before))
    rerun = rerun_unlocked(checks, run)
    events = run.events()[n_events:]
    stale = [f for _, e, f in events if e == "stale" and f.get("role") == "client"]
    checks.check(
        "the rerun removes the stale client before its cell's client starts",
        bool(stale) and all(f["handle"] in {str(p) for p in clients} for f in stale),
        str(events),
    )
    checks.check("the stale client is gone", not any(_alive(p) for p in clients), str(clients))
    lines = (run.run_dir / "orchestrator.log").read_text().splitlines()[-len(events) :]
    for line in lines:
        if any(f" {e} " in f" {line} " for e in ("stale", "alone", "reuse", "cell-done")):
            checks.message(line)
    missing = [c for c in run.cells if c not in before]
    record = json.loads(run.raw(missing[0]).read_text())
    alone = record.get("servesweep_isolation") or {}
    checks.check(
        "the rerun's raw record holds both checks: the stale client removed, the server idle "
        "(0 running, 0 queued, read from the server)",
        bool(alone.get("stale_clients_removed"))
        and alone.get("running") == 0
        and alone.get("queued") == 0
        and bool(alone.get("load_sources")),
        str(alone),
    )
    check_rerun(checks, run, before, n_events, rerun, reference)
