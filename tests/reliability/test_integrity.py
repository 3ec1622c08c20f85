"""Data integrity (issue 17): a record counts only if it was measured alone, with the
configuration it claims, and cleanup never touches a process that is not ours."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from servesweep.serving.engines import API_KEY_ENV
from tests.reliability.harness import (
    ACROSS,
    REQUESTS,
    TARGET,
    WITHIN,
    Checks,
    FaultShim,
    Run,
    check_later_run_reuses_the_service,
    check_rerun,
    check_stopped_cleanly,
    descendants,
    error_lines,
    fill,
    kill_group,
    output,
    rerun_and_check,
    rerun_unlocked,
    run_during_hang,
    small_filesystem,
    stable,
    wait_for,
    workload,
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


def test_double_load_after_sigkill_stale_client_removed(
    checks: Checks, make_run: Callable[..., Run], shim: FaultShim, reference: pd.DataFrame
) -> None:
    checks.scenario(
        "snakemake and the cell's job are SIGKILLed (the OOM killer), the load client keeps "
        "running; `--unlock` and rerun: the cell is measured alone"
    )
    run = make_run(WITHIN, workload=workload(LONG_REQUEST_TIMEOUT_S))
    clients: list[int] = []

    def kill_snakemake_and_job(proc: subprocess.Popen[str]) -> None:
        tree = descendants(proc.pid)
        jobs = [p for p in tree if "run_cell" in _cmdline(p) and "loadgen" not in _cmdline(p)]
        clients.extend(p for p in tree if "servesweep.measure.loadgen" in _cmdline(p))
        checks.check("the cell's job and its client run", bool(jobs and clients), str(tree))
        for pid in [proc.pid, *jobs]:  # snakemake and the job alone, not their group
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    run_during_hang(run, shim, kill_snakemake_and_job)
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


def _finished(checks: Checks, make_run: Callable[..., Run]) -> Run:
    """A run of the ACROSS slice that went through once."""
    run = make_run(ACROSS)
    first = run.snakemake()
    checks.check("the first run succeeds", first.returncode == 0, output(first)[-3000:])
    return run


def _one_line_error(
    checks: Checks, proc: subprocess.CompletedProcess[str], what: str = "re-aggregation"
) -> str:
    """`what` failed with a one-line `servesweep: <Kind>: ...` error; returns it (recorded)."""
    checks.check(f"{what} exits non-zero", proc.returncode != 0, output(proc)[-3000:])
    lines = error_lines(output(proc))
    checks.check("a one-line `servesweep: <Kind>: ...` error", bool(lines), output(proc)[-3000:])
    checks.message(lines[0])
    return lines[0]


def _reruns_alone(
    checks: Checks, run: Run, cell: str, succeeds: str = "the rerun succeeds"
) -> None:
    """A rerun succeeds and runs `cell` alone."""
    n_events = len(run.events())
    proc = run.snakemake()
    checks.check(succeeds, proc.returncode == 0, output(proc)[-3000:])
    ran = run.started(n_events)
    checks.check("the rerun runs that cell alone", ran == [cell], str(ran))


def _rejected(checks: Checks, run: Run, path: Path) -> str:
    """Re-aggregation fails with one line naming the file and saying to delete it."""
    line = _one_line_error(checks, run.snakemake())
    rel = str(path.relative_to(run.workdir))
    checks.check(
        "the error names the file and says to delete it",
        f"delete {rel}" in line or f"delete {path}" in line,
        line,
    )
    return line


def _deleted_reruns_its_cell(checks: Checks, run: Run, path: Path, cell: str) -> None:
    path.unlink()
    _reruns_alone(checks, run, cell, "the rerun after deleting it succeeds")
    df = pd.read_csv(run.run_dir / "results.csv")
    checks.check("results.csv has every cell", len(df) == len(run.cells), str(df))


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        ({"completed": REQUESTS - 1}, f"completed {REQUESTS - 1} of {REQUESTS} requests"),
        ({"errors": ["Traceback: boom"] + [""] * (REQUESTS - 1)}, "Traceback: boom"),
    ],
    ids=["record_edited_completed", "record_edited_error_string"],
)
def test_edited_record_rejected_by_aggregation(
    edit: dict[str, object],
    problem: str,
    checks: Checks,
    make_run: Callable[..., Run],
) -> None:
    what = "`completed` lowered by one" if "completed" in edit else "an error string added"
    checks.scenario(f"a finished raw record edited ({what}), then re-aggregated")
    run = _finished(checks, make_run)
    cell = run.cells[0]
    raw = run.raw(cell)
    record = json.loads(raw.read_text())
    raw.write_text(json.dumps({**record, **edit}) + "\n")
    line = _rejected(checks, run, raw)
    checks.check("the error names the cell and the problem", cell in line and problem in line, line)
    _deleted_reruns_its_cell(checks, run, raw, cell)


def test_gpu_snapshot_cut_corrupted_deleted(checks: Checks, make_run: Callable[..., Run]) -> None:
    checks.scenario("a finished GPU snapshot cut before its after rows, corrupted, then deleted")
    run = _finished(checks, make_run)
    cell = run.cells[0]
    gpu = run.gpu(cell)
    original = gpu.read_bytes()
    kept = [ln for ln in original.decode().splitlines(keepends=True) if ",after," not in ln]
    gpu.write_text("".join(kept))
    proc = run.snakemake()
    checks.check("re-aggregation of the cut file succeeds", proc.returncode == 0, output(proc))
    df = pd.read_csv(run.run_dir / "results.csv")
    status = df.loc[df["server_id"] == cell.split("/")[0], "gpu_status"].tolist()
    checks.check("the cut snapshot is `incomplete`, never `ok`", status == ["incomplete"], status)
    gpu.write_bytes(original[:40] + b"\xff\xfe\x00\x81" + original[44:])
    line = _rejected(checks, run, gpu)
    checks.check(
        "the error names the cell and the snapshot, no traceback",
        cell in line and "GPU snapshot" in line and "Traceback" not in line,
        line,
    )
    _deleted_reruns_its_cell(checks, run, gpu, cell)


def test_gpu_file_cut_at_a_line_boundary(checks: Checks, make_run: Callable[..., Run]) -> None:
    checks.scenario(
        "a finished GPU file cut at a line boundary (half its lines kept, every line whole), "
        "then re-aggregated: `incomplete` with blank figures, never accepted as `ok` or "
        "`simulated`; deleted, its cell reruns"
    )
    run = _finished(checks, make_run)
    cell = run.cells[0]
    gpu = run.gpu(cell)
    lines = gpu.read_text().splitlines(keepends=True)
    gpu.write_text("".join(lines[: len(lines) // 2]))
    proc = run.snakemake()
    checks.check("re-aggregation of the cut file succeeds", proc.returncode == 0, output(proc))
    df = pd.read_csv(run.run_dir / "results.csv")
    row = df.loc[df["server_id"] == cell.split("/")[0]].iloc[0]
    checks.check(
        "the cut file is `incomplete`", row["gpu_status"] == "incomplete", str(row["gpu_status"])
    )
    checks.check(
        "its energy and power are blank, not figures of part of the window",
        pd.isna(row["gpu_energy_j"]) and pd.isna(row["gpu_power_mean_w"]),
        str(row[["gpu_energy_j", "gpu_power_mean_w"]].to_dict()),
    )
    log = (run.run_dir / "logs" / "collect_results.log").read_text()
    said = [ln for ln in log.splitlines() if str(gpu.relative_to(run.workdir)) in ln]
    checks.check("the log names the cut file", bool(said), log[-2000:])
    checks.message(said[0].split(" WARNING ", 1)[-1])
    _deleted_reruns_its_cell(checks, run, gpu, cell)


def test_config_changed_after_snakemake_dir_lost(
    checks: Checks, make_run: Callable[..., Run]
) -> None:
    checks.scenario(
        "`.snakemake/` lost, then workload.num_requests edited: the records' own copy of their "
        "configuration is compared, the changed cells rerun (not 'nothing to be done', exit 0)"
    )
    run = _finished(checks, make_run)
    old = {c: run.raw(c).read_bytes() for c in run.cells}
    shutil.rmtree(run.workdir / ".snakemake")
    _edit_config(run, lambda c: c["workload"].update(num_requests=REQUESTS + 1))
    n_events = len(run.events())
    proc = run.snakemake()
    checks.check("the run succeeds", proc.returncode == 0, output(proc)[-3000:])
    ran = run.started(n_events)
    checks.check("it reruns every changed cell", sorted(ran) == sorted(run.cells), str(ran))
    kept = {c: list(run.run_dir.glob(f"raw/.superseded/*/raw/{c}.jsonl")) for c in run.cells}
    checks.check(
        "each replaced record is kept under raw/.superseded/<time>/",
        all(len(p) == 1 and p[0].read_bytes() == old[c] for c, p in kept.items()),
        str(kept),
    )
    df = pd.read_csv(run.run_dir / "results.csv")
    checks.check(
        "results.csv holds the new measurement",
        set(df["completed"]) == {REQUESTS + 1},
        str(df["completed"].tolist()),
    )
    n_events = len(run.events())
    again = run.snakemake()
    checks.check("a second run succeeds", again.returncode == 0, output(again)[-2000:])
    checks.check("it runs no cell", run.started(n_events) == [], str(run.started(n_events)))


def _stale_handle(run: Run, pid: int) -> None:
    """current.json as a killed run leaves it, naming `pid` as its server (the PID reused)."""
    backend = TARGET
    state = {
        "fingerprint": "0123456789ab",
        "server_id": f"moe_runner_backend~{backend},chunked_prefill_size~8192",
        "base_url": f"http://127.0.0.1:{run.port}",
        "ranks": [
            {
                "role": "server",
                "node": "local",
                "rank": 0,
                "handle": str(pid),
                "log_path": str(run.workdir / "gone.log"),
                "url": f"http://127.0.0.1:{run.port}",
            }
        ],
        "started_at": 0.0,
        "ready_at": 1.0,
    }
    current = run.run_dir / "service" / "current.json"
    current.parent.mkdir(parents=True, exist_ok=True)
    current.write_text(json.dumps(state))


def _servesweep(run: Run, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from servesweep.workflow.cli import main; sys.exit(main(sys.argv[1:]))",  # noqa: E501
            *args,
            "--configfile",
            str(run.config),
            "--results",
            str(run.workdir / "results"),
        ],
        capture_output=True,
        text=True,
        cwd=run.workdir,
        env=run.full_env(),
        timeout=300,
    )


def test_stale_pid_of_an_unrelated_process_is_left_alone(
    checks: Checks, make_run: Callable[..., Run]
) -> None:
    checks.scenario(
        "current.json names a PID now owned by an unrelated process group (`setsid sleep`): "
        "the rerun and `servesweep down` leave it alone"
    )
    run = _finished(checks, make_run)
    sleeper = subprocess.Popen(["setsid", "sleep", "600"])  # its own group, as from a shell
    try:
        wait_for(lambda: _alive(sleeper.pid), what="sleep to start")
        _stale_handle(run, sleeper.pid)
        run.raw(run.cells[-1]).unlink()
        n_events = len(run.events())
        rerun = run.snakemake()
        checks.check("the rerun succeeds", rerun.returncode == 0, output(rerun)[-3000:])
        checks.check("the unrelated process survives the rerun", _alive(sleeper.pid))
        events = run.events()[n_events:]
        left = [f for _, e, f in events if e == "not-ours"]
        checks.check(
            "the rerun says it left it alone (`not-ours` event)",
            [f.get("handle") for f in left] == [str(sleeper.pid)],
            str(events),
        )
        for line in (run.run_dir / "orchestrator.log").read_text().splitlines():
            if " not-ours " in f" {line} ":
                checks.message(line)
        _stale_handle(run, sleeper.pid)
        down = _servesweep(run, "down")
        checks.check("`servesweep down` succeeds", down.returncode == 0, output(down))
        checks.check("the unrelated process survives `servesweep down`", _alive(sleeper.pid))
        said = [ln for ln in output(down).splitlines() if "left alone" in ln]
        checks.check("`servesweep down` says it left it alone", bool(said), output(down))
        checks.message(said[0])
    finally:
        sleeper.kill()
        sleeper.wait()


def _terminated_mid_cell(
    checks: Checks, run: Run, shim: FaultShim, reference: pd.DataFrame, sig: signal.Signals
) -> None:
    """snakemake's process group gets `sig` mid-cell: the stop checks, the cell's job wrote
    `cell-failed`, onerror stopped the server; then the rerun checks."""
    proc = run_during_hang(run, shim, lambda p: kill_group(p, sig))
    check_stopped_cleanly(checks, run, proc, cause=rf"Terminated: .*{sig.name}", finished=1)
    events = [e for _, e, _ in run.events()]
    checks.check("the cell job wrote `cell-failed`", "cell-failed" in events, events)
    checks.check("onerror stopped the server (last event `stop`)", events[-1] == "stop", events)
    rerun_and_check(checks, run, reference)


def test_snakemake_gets_sighup(
    checks: Checks, make_run: Callable[..., Run], shim: FaultShim, reference: pd.DataFrame
) -> None:
    checks.scenario("snakemake's process group gets SIGHUP (the SSH session drops) mid-cell")
    _terminated_mid_cell(checks, make_run(WITHIN), shim, reference, signal.SIGHUP)


def _edit_config(run: Run, change: Callable[[dict[str, object]], None]) -> None:
    config = yaml.safe_load(run.config.read_text())
    change(config)
    run.config.write_text(yaml.safe_dump(config, sort_keys=False))


def test_config_changed_after_a_run(checks: Checks, make_run: Callable[..., Run]) -> None:
    checks.scenario(
        "the config changed after a finished run: warm-up policy (cells rerun), the baseline "
        "(summary rerun), the client's tokenizer after `.snakemake/` is lost (re-aggregation "
        "refuses the records)"
    )
    run = make_run(ACROSS)
    targets = [*run.targets, f"results/{run.run_id}/summary.json"]
    first = run.snakemake("--cores", "1", *targets)
    checks.check("the first run succeeds", first.returncode == 0, output(first)[-3000:])
    record = json.loads(run.raw(run.cells[0]).read_text())
    carried = record.get("servesweep_measured_with") or {}
    checks.check(
        "each raw record carries what it was measured with (fingerprint, workload, client "
        "kind/version/tokenizer, warm-up)",
        {"fingerprint", "workload", "client", "warmup_after_start"} <= set(carried)
        and {"kind", "version", "tokenizer"} <= set(carried.get("client", {})),
        str(carried),
    )

    n_events = len(run.events())
    _edit_config(run, lambda c: c.update(warmup_after_start=1))
    again = run.snakemake("--cores", "1", *targets)
    checks.check("the run after the warm-up change succeeds", again.returncode == 0, output(again))
    ran = run.started(n_events)
    checks.check("a warm-up change reruns every cell", sorted(ran) == sorted(run.cells), str(ran))

    summary = run.run_dir / "summary.json"
    before = summary.stat().st_mtime_ns
    _edit_config(run, lambda c: c.update(baseline={"moe_runner_backend": "marlin"}))
    third = run.snakemake("--cores", "1", *targets)
    checks.check("the run after the baseline change succeeds", third.returncode == 0, output(third))
    checks.check(
        "a baseline change reruns summarize (its param)",
        summary.stat().st_mtime_ns != before,
        output(third)[-2000:],
    )

    shutil.rmtree(run.workdir / ".snakemake")
    _edit_config(run, lambda c: c.setdefault("client", {}).update(tokenizer="other/tokenizer"))
    table = f"results/{run.run_id}/results.csv"
    proc = run.snakemake(
        "--cores", "1", "--forcerun", "collect_results", "--allowed-rules", "collect_results", table
    )
    line = _one_line_error(checks, proc)
    checks.check(
        "the error names the cells and the differing key, never relabels",
        all(c in line for c in run.cells) and "client.tokenizer" in line,
        line,
    )


def test_watchdog_stops_a_frozen_server(
    checks: Checks, make_run: Callable[..., Run], shim: FaultShim, reference: pd.DataFrame
) -> None:
    checks.scenario(
        "the server freezes mid-cell (SIGSTOP, as a GPU or NCCL hang): the watchdog aborts the "
        "cell (validation.stall_timeout_s 3, request_timeout_s 300)"
    )
    run = make_run(
        WITHIN, workload=workload(LONG_REQUEST_TIMEOUT_S), validation={"stall_timeout_s": 3}
    )

    def freeze(_: subprocess.Popen[str]) -> None:
        state = json.loads((run.run_dir / "service" / "current.json").read_text())
        os.killpg(int(state["ranks"][0]["handle"]), signal.SIGSTOP)

    proc = run_during_hang(run, shim, freeze)
    check_stopped_cleanly(
        checks, run, proc, cause=r"ServerStalled: .*server \S+ on node local", finished=1
    )
    rerun_and_check(checks, run, reference)


def test_cell_job_sigkilled_alone_stale_partials_removed(
    checks: Checks, make_run: Callable[..., Run], shim: FaultShim, reference: pd.DataFrame
) -> None:
    checks.scenario(
        "the cell's job process alone is SIGKILLed mid-cell (`kill -9`, the OOM killer): "
        "Snakemake's onerror says so for the cell (its line, `cell-failed`), stops the client "
        "the job left and removes its hidden client file; the rerun removes older partial "
        "client files and reports them"
    )
    run = make_run(WITHIN, workload=workload(LONG_REQUEST_TIMEOUT_S))
    hidden: list[Path] = []

    def kill_job(proc: subprocess.Popen[str]) -> None:
        jobs = [p for p in descendants(proc.pid) if "run_cell" in _cmdline(p)]
        hidden.extend((run.run_dir / "bench").glob("*/*/.*client.jsonl"))
        for pid in jobs:
            os.kill(pid, signal.SIGKILL)

    proc = run_during_hang(run, shim, kill_job)
    checks.check("the killed job's client was writing its hidden file", bool(hidden), str(hidden))
    check_stopped_cleanly(
        checks, run, proc, cause=r"JobDied: .*ended without reporting why.*SIGKILL", finished=1
    )
    cell = next(c for c in run.cells if c not in run.finished())
    failed = [f for _, e, f in run.events() if e == "cell-failed" and f.get("cell") == cell]
    checks.check("a `cell-failed` event names the killed cell", bool(failed), str(run.events()))
    checks.check(
        "the hidden client file is gone before any rerun",
        not any(p.exists() for p in hidden),
        str([p for p in hidden if p.exists()]),
    )
    bench = run.run_dir / "bench" / f"{cell}.log"
    # What a job killed while its client wrote leaves (a hidden per-job file; the older name).
    partials = [
        bench.with_name(f".{bench.stem}.{2**22 + 7}.client.jsonl"),
        bench.with_name(f".{bench.stem}.client.jsonl"),
    ]
    for path in partials:
        path.write_text('{"completed": 1')
    before, n_events = run.finished(), len(run.events())
    rerun = run.snakemake()
    events = run.events()[n_events:]
    removed = {f["file"] for _, e, f in events if e == "partial-removed"}
    planted = {str(p.relative_to(run.workdir)) for p in partials}
    checks.check(
        "the rerun removes the partial client files and reports each (`partial-removed`)",
        planted <= removed and not any(p.exists() for p in partials),
        f"planted {planted}, removed {removed}",
    )
    for line in (run.run_dir / "orchestrator.log").read_text().splitlines():
        if " partial-removed " in line:
            checks.message(line)
    check_rerun(checks, run, before, n_events, rerun, reference)


class ForeignClient:
    """Requests from elsewhere while the run's second cell runs (after its `cell-start`, until
    its end): with `key` (read, as anyone of the same uid can, from the server's environment)
    or without. Keeps the status of every answer."""

    def __init__(self, run: Run, *, with_key: bool) -> None:
        self.run, self.with_key = run, with_key
        self.statuses: list[int] = []
        self.key = ""
        self.in_argv: set[str] = set()  # processes whose command line held the key
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> ForeignClient:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _second_cell_running(self) -> bool:
        events = self.run.events()
        starts = [f["cell"] for _, e, f in events if e == "cell-start"]
        ends = [f["cell"] for _, e, f in events if e in ("cell-done", "cell-failed")]
        return len(starts) >= 2 and len(ends) < 2

    def _loop(self) -> None:
        current = self.run.run_dir / "service" / "current.json"
        while not self._stop.is_set() and not self._second_cell_running():
            time.sleep(0.02)
        state = json.loads(current.read_text())
        pid = state["ranks"][0]["handle"]
        environ = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
        self.key = next(e.split("=", 1)[1] for e in environ if e.startswith(f"{API_KEY_ENV}="))
        headers = {"Content-Type": "application/json"}
        if self.with_key:
            headers["Authorization"] = f"Bearer {self.key}"
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 1}}
        while not self._stop.is_set() and self._second_cell_running():
            self.in_argv |= {c for c in _cmdlines() if self.key in c}
            request = urllib.request.Request(
                f"{state['base_url']}/generate", data=json.dumps(body).encode(), headers=headers
            )
            try:
                with urllib.request.urlopen(request, timeout=10) as resp:
                    resp.read()
                    self.statuses.append(resp.status)
            except urllib.error.HTTPError as exc:
                self.statuses.append(exc.code)
            except OSError:
                pass
            time.sleep(0.05)


def cell_named(events: list[dict[str, str]], line: str) -> bool:
    """The `foreign-requests` event's cell is the one the error line names."""
    return all(f"cell {f.get('cell')}:" in line for f in events)


def _cmdlines() -> list[str]:
    return [_cmdline(int(p.name)) for p in Path("/proc").glob("[0-9]*")]


def _files_holding(root: Path, text: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


def _run_beside_foreign_client(
    make_run: Callable[..., Run], *, with_key: bool
) -> tuple[Run, subprocess.CompletedProcess[str], ForeignClient]:
    """A WITHIN run (validation.foreign_requests_invalid) while a ForeignClient sends requests."""
    run = make_run(WITHIN, validation={"foreign_requests_invalid": True})
    with ForeignClient(run, with_key=with_key) as foreign:
        proc = run.snakemake()
    return run, proc, foreign


def test_foreign_requests_without_the_key(
    checks: Checks, make_run: Callable[..., Run], reference: pd.DataFrame
) -> None:
    checks.scenario(
        "another client on the network sends requests to the server during a cell, without "
        "the service's API key"
    )
    run, proc, foreign = _run_beside_foreign_client(make_run, with_key=False)
    checks.check("the run succeeds", proc.returncode == 0, output(proc)[-3000:])
    checks.check(
        "every foreign request is refused with 401 (SGLang's --api-key; the sim enforces it)",
        bool(foreign.statuses) and set(foreign.statuses) == {401},
        str(foreign.statuses),
    )
    checks.note(f"{len(foreign.statuses)} foreign requests, all answered 401")
    counts = [
        json.loads(run.raw(c).read_text()).get("servesweep_requests") or {} for c in run.cells
    ]
    checks.check(
        "each raw record compares the server's request counter with the client's count: "
        "no difference",
        all(c.get("api_key") and c.get("difference") == 0 and c.get("sources") for c in counts),
        str(counts),
    )
    checks.check(
        "the key is in no process's command line while the cell runs (server, client, shells)",
        not foreign.in_argv,
        str(foreign.in_argv),
    )
    checks.check(
        "the key is in no file of the run (results, logs, records, .snakemake)",
        bool(foreign.key) and not _files_holding(run.workdir, foreign.key),
        str(_files_holding(run.workdir, foreign.key)),
    )
    got = stable(pd.read_csv(run.run_dir / "results.csv"))
    want = stable(reference[reference["server_id"].isin(got["server_id"])])
    checks.check(
        "results.csv equals an undisturbed run's (cells, counts, token totals)",
        got.equals(want),
        f"{got}\nvs\n{want}",
    )


def test_foreign_requests_with_the_key_counted(
    checks: Checks, make_run: Callable[..., Run], reference: pd.DataFrame
) -> None:
    checks.scenario(
        "someone holding the key (same uid: the server's environment) sends requests during a "
        "cell; validation.foreign_requests_invalid is true"
    )
    run, proc, foreign = _run_beside_foreign_client(make_run, with_key=True)
    checks.check("foreign requests were answered", 200 in foreign.statuses, str(foreign.statuses))
    line = check_stopped_cleanly(
        checks,
        run,
        proc,
        cause=r"CellFailed: .*counted \d+ request\(s\).*client sent \d+.*someone else's",
        finished=1,
    )
    events = [f for _, e, f in run.events() if e == "foreign-requests"]
    checks.check(
        "a `foreign-requests` event names the cell", bool(events) and cell_named(events, line), ""
    )
    rerun_and_check(checks, run, reference)


def test_service_key_found_by_a_later_run(checks: Checks, make_run: Callable[..., Run]) -> None:
    checks.scenario(
        "`servesweep up` starts a service with its API key; a later run under another RUN_ID "
        "finds the key over the transport (the service's environment), not in a file"
    )
    run = make_run({"backends": (TARGET,), "concurrencies": (2,)})
    up = _servesweep(run, "up")
    try:
        checks.check("`servesweep up` succeeds", up.returncode == 0, output(up))
        [record] = (run.workdir / "results" / ".services").glob("*.json")
        pid = json.loads(record.read_text())["ranks"][0]["handle"]
        environ = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
        keys = [e.split("=", 1)[1] for e in environ if e.startswith(f"{API_KEY_ENV}=")]
        checks.check("the service has a key (in its environment only)", bool(keys), str(pid))
        later = f"{run.run_id}-later"
        check_later_run_reuses_the_service(checks, run, later)
        checks.check(
            "the key is in no file (results, service records, logs)",
            not _files_holding(run.workdir, keys[0]),
            str(_files_holding(run.workdir, keys[0])),
        )
    finally:
        down = _servesweep(run, "down")
        checks.check("`servesweep down` succeeds", down.returncode == 0, output(down))


# ---------------------------------------------------------------- item 10: messages


def test_snakemake_gets_sigterm(
    checks: Checks, make_run: Callable[..., Run], shim: FaultShim, reference: pd.DataFrame
) -> None:
    checks.scenario(
        "snakemake's process group gets SIGTERM mid-cell (a batch system ending the job): the "
        "cell's own line, not 'job process N ended without a status'"
    )
    _terminated_mid_cell(checks, make_run(WITHIN), shim, reference, signal.SIGTERM)


@pytest.mark.parametrize(
    "damage",
    ["cut", "bytes"],
    ids=["record_cut_mid_line", "record_corrupted_bytes"],
)
def test_corrupt_record_rejected_by_aggregation(
    damage: str, checks: Checks, make_run: Callable[..., Run]
) -> None:
    what = "cut in the middle of its line" if damage == "cut" else "with bytes overwritten"
    checks.scenario(f"a finished raw record {what}, then re-aggregated")
    run = _finished(checks, make_run)
    cell = run.cells[0]
    raw = run.raw(cell)
    data = raw.read_bytes()
    raw.write_bytes(data[: len(data) // 2] if damage == "cut" else b"\xff\xfe\x00" + data[3:])
    line = _rejected(checks, run, raw)
    checks.check("the error names the cell, no traceback", cell in line, line)
    _deleted_reruns_its_cell(checks, run, raw, cell)


def test_client_disk_fills(
    checks: Checks, make_run: Callable[..., Run], reference: pd.DataFrame
) -> None:
    checks.scenario(
        "the disk the client writes its record and log to is full (ENOSPC): named as such, not "
        "only 'client exited 1'"
    )
    run = make_run(ACROSS)
    victim = run.run_dir / "bench" / run.cells[-1].split("/")[0]
    with small_filesystem(victim) as mount:
        filler = fill(mount)
        proc = run.snakemake()
        line = check_stopped_cleanly(
            checks,
            run,
            proc,
            cause=r"ClientError: .*client exited \d+ .*disk is full",
            finished=1,
        )
        checks.check("the error names the full directory", str(mount) in line, line)
        rerun_and_check(checks, run, reference, remove_cause=filler.unlink)


def test_event_log_disk_full(checks: Checks, make_run: Callable[..., Run]) -> None:
    checks.scenario(
        "orchestrator.log is on a full disk when a cell starts (ENOSPC while logging an event)"
    )
    run = _finished(checks, make_run)
    cell = run.cells[-1]
    run.raw(cell).unlink()
    log = run.run_dir / "orchestrator.log"
    kept = log.read_bytes()
    with small_filesystem(run.workdir / "full") as mount:
        filler = fill(mount)
        target = mount / "orchestrator.log"
        log.unlink()
        log.symlink_to(target)
        line = _one_line_error(checks, run.snakemake(), "the run")
        checks.check(
            "the error names the cell, the file and the cause",
            f"cell {cell}" in line and "orchestrator.log" in line and "No space left" in line,
            line,
        )
        checks.check("no raw file for the cell", not run.raw(cell).exists())
        checks.check("nothing is left running", not run.leftovers(), str(run.leftovers()))
        log.unlink()
        log.write_bytes(kept)
        filler.unlink()
    _reruns_alone(checks, run, cell)


def test_analysis_job_disk_full(checks: Checks, make_run: Callable[..., Run]) -> None:
    checks.scenario(
        "the disk of the plots is full when an analysis job (plot_results) writes them (ENOSPC): "
        "its line names the file, not only 'No space left on device'"
    )
    run = _finished(checks, make_run)
    with small_filesystem(run.run_dir / "plots") as mount:
        filler = fill(mount)
        line = _one_line_error(checks, run.snakemake("--cores", "1", "all"), "`all`")
        checks.check(
            "the error names the cause and a file on the full disk",
            "No space left on device" in line and f"{run.run_id}/plots/" in line,
            line,
        )
        checks.check("nothing is left running", not run.leftovers(), str(run.leftovers()))
        filler.unlink()
    n_events = len(run.events())
    proc = run.snakemake("--cores", "1", "all")
    checks.check("the rerun succeeds", proc.returncode == 0, output(proc)[-3000:])
    checks.check("it runs no cell", run.started(n_events) == [], str(run.started(n_events)))


def test_config_edit_keeps_the_records_it_replaces(
    checks: Checks, make_run: Callable[..., Run]
) -> None:
    checks.scenario(
        "workload.num_requests edited after a finished run: the dry-run's plan counts the cells "
        "Snakemake reruns, with the reason, and says it replaces records; the rerun keeps them "
        "under raw/.superseded/<time>/, listed in the manifest"
    )
    run = make_run(WITHIN)
    manifest = run.run_dir / "manifest.json"
    targets = [*run.targets, str(manifest.relative_to(run.workdir))]
    first = run.snakemake("--cores", "1", *targets)
    checks.check("the first run succeeds", first.returncode == 0, output(first)[-3000:])
    old = {c: run.raw(c).read_bytes() for c in run.cells}
    _edit_config(run, lambda c: c["workload"].update(num_requests=REQUESTS + 1))

    dry = run.snakemake("-n", *targets)
    jobs = re.findall(r"^run_cell\s+(\d+)\s*$", dry.stdout + dry.stderr, flags=re.M)
    last = dry.stdout.strip().splitlines()[-1] if dry.stdout.strip() else ""
    n = len(run.cells)
    checks.check(
        "snakemake -n reruns every cell (params changed)",
        dry.returncode == 0 and jobs and set(jobs) == {str(n)},
        output(dry)[-2000:],
    )
    checks.check(
        "its last line (the plan) counts them with the reason and says records are replaced",
        f"{n} of {n} cell-repeats to run ({n} changed measurement)" in last
        and f"REPLACES {n} measured record(s)" in last,
        last,
    )
    checks.message(last)

    n_events = len(run.events())
    again = run.snakemake("--cores", "1", *targets)
    checks.check("the rerun succeeds", again.returncode == 0, output(again)[-3000:])
    checks.check("it reruns every cell", sorted(run.started(n_events)) == sorted(run.cells))
    kept = {c: list(run.run_dir.glob(f"raw/.superseded/*/raw/{c}.jsonl")) for c in run.cells}
    checks.check(
        "each replaced record is kept byte for byte under raw/.superseded/<time>/",
        all(len(p) == 1 and p[0].read_bytes() == old[c] for c, p in kept.items()),
        str(kept),
    )
    checks.check(
        "the new records are the new measurement",
        all(run.raw(c).read_bytes() != old[c] for c in run.cells),
    )
    listed = json.loads(manifest.read_text()).get("superseded", [])
    checks.check(
        "manifest.json lists every kept record",
        sorted(listed) == sorted(str(p[0].relative_to(run.run_dir)) for p in kept.values()),
        str(listed),
    )
    events = [f for _, e, f in run.events()[n_events:] if e == "superseded"]
    checks.check(
        "a `superseded` event per cell names the reason",
        sorted(f["cell"] for f in events) == sorted(run.cells)
        and {f["reason"] for f in events} == {"changed measurement"},
        str(events),
    )
    checks.finish()


def test_forged_import_never_reaches_another_run(
    checks: Checks, make_run: Callable[..., Run]
) -> None:
    checks.scenario(
        "`servesweep import` of a record whose `backend` (an axis read from the record) walks "
        "into another run's raw folder, with 3x its output throughput; then that run's "
        "`snakemake` again"
    )
    run = make_run(ACROSS)
    first = run.snakemake()
    checks.check("the run succeeds", first.returncode == 0, output(first)[-3000:])
    before, n_events = run.finished(), len(run.events())
    victim = run.cells[0]
    forged = json.loads(run.raw(victim).read_text())
    server, client, _ = victim.split("/")
    forged["backend"] = f"x/../../../{run.run_id}/raw/{server}"
    forged["output_throughput"] *= 3
    source = run.workdir / "forged"
    source.mkdir()
    (source / "a.jsonl").write_text(json.dumps(forged) + "\n")
    mapping = run.workdir / "mapping.yaml"
    mapping.write_text("server:\n  backend: {record: backend}\n")
    argv = [sys.executable, "-m", "servesweep.workflow.cli", "import", str(source)]
    argv += ["--run-id", "imp", "--mapping", str(mapping), "--no-plots"]
    proc = subprocess.run(
        [*argv, "--results", str(run.workdir / "results")],
        capture_output=True,
        text=True,
        env=run.full_env(),
        timeout=120,
    )
    checks.check(
        "the import refuses the record: its id is no single folder name",
        proc.returncode != 0 and "no single path segment" in proc.stdout + proc.stderr,
        output(proc)[-2000:],
    )
    lines = (proc.stdout + proc.stderr).splitlines()
    checks.message(next((x for x in lines if "no single path segment" in x), ""))
    checks.check(
        "the other run's records are untouched (content and mtime)",
        run.finished() == before,
        str(run.finished()),
    )
    table = pd.read_csv(run.run_dir / "results.csv")
    rerun = run.snakemake()
    checks.check("that run's next snakemake succeeds", rerun.returncode == 0, output(rerun))
    checks.check("it runs no cell", run.started(n_events) == [], str(run.started(n_events)))
    after = pd.read_csv(run.run_dir / "results.csv")
    checks.check(
        "its results.csv keeps the measured throughput",
        list(after["output_tps"]) == list(table["output_tps"]),
        f"{list(table['output_tps'])} -> {list(after['output_tps'])}",
    )
    checks.finish()


def test_import_into_an_interrupted_run_is_refused(
    checks: Checks, make_run: Callable[..., Run], shim: FaultShim
) -> None:
    checks.scenario(
        "`servesweep import --run-id X` into the folder of a run interrupted mid-cell (raw "
        "records, no results.csv yet), with a record of one of its measured cells"
    )
    run = make_run(WITHIN)
    proc = run_during_hang(run, shim, lambda p: kill_group(p, signal.SIGINT))
    checks.check("the interrupted run exits non-zero", proc.returncode != 0, output(proc)[-2000:])
    raws = sorted((run.run_dir / "raw").rglob("*.jsonl"))
    checks.check(
        "its folder holds a measured raw record and no results.csv",
        len(raws) == 1 and not (run.run_dir / "results.csv").exists(),
        str(raws),
    )
    before = {p: hashlib.md5(p.read_bytes()).hexdigest() for p in raws}
    # The same cell's record under another figure, named so the mapping puts it on that cell.
    record = json.loads(raws[0].read_text())
    record["output_throughput"] *= 3
    source = run.workdir / "to-import"
    source.mkdir()
    (source / f"{TARGET}_chunk8192_c2_r1.jsonl").write_text(json.dumps(record) + "\n")
    mapping = run.workdir / "mapping.yaml"
    mapping.write_text(
        'files: "*.jsonl"\n'
        f"server:\n  moe_runner_backend: '^({TARGET})_'\n"
        "  chunked_prefill_size: '_chunk(\\d+)_'\n"
        "client:\n  concurrency: '_c(\\d+)_'\n"
        "repeat: '_r(\\d+)\\.jsonl$'\n"
    )
    argv = [sys.executable, "-m", "servesweep.workflow.cli", "import", str(source)]
    argv += ["--run-id", run.run_id, "--mapping", str(mapping), "--no-plots"]
    imported = subprocess.run(
        [*argv, "--results", str(run.workdir / "results")],
        capture_output=True,
        text=True,
        env=run.full_env(),
        timeout=120,
    )
    text = output(imported)
    refusal = [x for x in text.splitlines() if "already holds a run" in x]
    checks.check(
        "the import refuses in one line naming the run folder and a file it holds",
        imported.returncode != 0 and len(refusal) == 1 and str(run.run_dir) in refusal[0],
        text[-2000:],
    )
    checks.message(refusal[0] if refusal else "")
    after = {p: hashlib.md5(p.read_bytes()).hexdigest() for p in raws}
    checks.check("every raw record is byte-identical (md5)", after == before, f"{before} {after}")
    checks.check(
        "no file was added to the run folder's raw records",
        sorted((run.run_dir / "raw").rglob("*.jsonl")) == raws,
        str(sorted((run.run_dir / "raw").rglob("*.jsonl"))),
    )
    checks.finish()


def test_status_shows_escapes_visibly(checks: Checks, make_run: Callable[..., Run]) -> None:
    checks.scenario(
        "`servesweep status` while a process on the node carries server labels holding "
        "terminal escapes (set the title, clear the screen, a forged line)"
    )
    run = make_run(WITHIN)
    planted = "\x1b]0;pwned\x07\x1b[2J\x1b[31mforged\trow=1"
    env = {
        **os.environ,
        "SERVESWEEP_LABEL_KIND": "server",
        "SERVESWEEP_LABEL_RUN": run.run_id,
        "SERVESWEEP_LABEL_SERVER": planted,
    }
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"], env=env, start_new_session=True
    )
    try:
        proc = _servesweep(run, "status")
    finally:
        sleeper.kill()
        sleeper.wait()
    text = output(proc)
    checks.check("status succeeds", proc.returncode == 0, text[-2000:])
    shown = [x for x in proc.stdout.splitlines() if f"handle={sleeper.pid}" in x]
    checks.check("it lists the labelled process on one line", len(shown) == 1, repr(text))
    checks.message(shown[0] if shown else "")
    checks.check("no escape or control character reaches the terminal", "\x1b" not in text)
    checks.check(
        "the label's text is shown with its escapes made visible (`\\x1b`, `\\x09`)",
        "server=\\x1b]0;pwned\\x07\\x1b[2J\\x1b[31mforged\\x09row=1" in shown[0],
        repr(shown[0]),
    )
    checks.finish()


@pytest.mark.parametrize(
    "unlock", [False, True], ids=["refused_by_the_lock", "refused_after_unlock"]
)
def test_a_refused_duplicate_run_leaves_the_live_run_alone(
    unlock: bool, checks: Checks, make_run: Callable[..., Run], shim: FaultShim
) -> None:
    how = (
        "after `snakemake --unlock`, refused by the cell's lock"
        if unlock
        else "refused by the lock"
    )
    checks.scenario(
        f"a second snakemake of the same run while the first one measures ({how}): it stops "
        "nothing of the live run"
    )
    run = make_run(WITHIN, workload=workload(LONG_REQUEST_TIMEOUT_S))
    state_file = run.run_dir / "service" / "current.json"
    seen: dict[str, Any] = {}

    def start_a_duplicate(first: subprocess.Popen[str]) -> None:
        handles = [r["handle"] for r in json.loads(state_file.read_text())["ranks"]]
        n_events = len(run.events())
        if unlock:
            run.snakemake("--unlock")
        seen["proc"] = run.snakemake()
        seen["events"] = [(e, f) for _, e, f in run.events()[n_events:]]
        seen["handles"] = handles
        seen["alive"] = [h for h in handles if _alive(int(h))]
        os.killpg(first.pid, signal.SIGTERM)  # then the live run ends, as a batch system ends it

    run_during_hang(run, shim, start_a_duplicate)
    text = output(seen["proc"])
    checks.check("the duplicate exits non-zero", seen["proc"].returncode != 0, text[-2000:])
    why = "another live snakemake" if unlock else "cannot be locked"
    lines = [x for x in text.splitlines() if why in x or "LockException" in x]
    checks.check("it says why it was refused", bool(lines), text[-2000:])
    checks.message(lines[0] if lines else "")
    stops = [f for e, f in seen["events"] if e in ("stop", "stale", "unhealthy")]
    checks.check("it stops no server (no `stop` event while it ran)", not stops, str(stops))
    checks.check(
        "the live run's server still runs after the refused run ended",
        bool(seen["handles"]) and seen["alive"] == seen["handles"],
        f"{seen['handles']}, alive {seen['alive']}",
    )
    checks.finish()
