"""Faults where Slurm is the cluster: the single-machine cluster of .ci/setup_slurm.sh (nodes
node1..node4, proctrack/cgroup), servers as job steps of an allocation per pool. Each scenario
has its own run id, ports and allocation names; it cancels only the allocations it made."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from servesweep.cluster.owner import current_owner
from servesweep.cluster.runtime import owner_dir
from servesweep.cluster.slurm import allocation_name, squeue_jobs, squeue_steps
from servesweep.config.load import load_experiment
from servesweep.config.matrix import server_specs
from tests.helpers import deep_update
from tests.integration.test_slurm_steps import slurm_cluster  # noqa: F401  (skip/fail: no Slurm)
from tests.reliability.harness import (
    HANG_MARKER,
    SECOND_CELL_INDEX,
    SNAKEMAKE_TIMEOUT_S,
    TARGET,
    WITHIN,
    Checks,
    FaultShim,
    Run,
    check_later_run_reuses_the_service,
    check_stopped_cleanly,
    error_lines,
    file_contains,
    kill_group,
    kill_local_leftovers,
    local_config,
    log_paths,
    output,
    rerun_and_check,
    server_id,
    unique_run_id,
    wait_for,
    workload,
)

pytestmark = [pytest.mark.reliability, pytest.mark.integration, pytest.mark.slurm]

SLURM_READY_TIMEOUT_S = 60


def slurm_config(
    run_id: str, shim: FaultShim, *, nodes: list[str], gpus: int | None = 0, **layout: Any
) -> dict:
    """A slice of the suite's matrix on Slurm nodes: every rank a step of the pool's
    allocation, the process runtime (the nodes are this machine: the shim is on their path).
    `gpus`: GPUs asked per node (None: all 8; 0, the default: none, so that scenarios on one
    node run beside the other Slurm tests)."""
    config = local_config(run_id, shim, **layout)
    config["engine"]["ready_timeout_s"] = SLURM_READY_TIMEOUT_S
    return {
        **config,
        "cluster": {
            "transport": "slurm",
            "nodes": nodes,
            "gpus_per_node": 8,
            "slurm": {
                "partition": "debug",
                "time_limit": "00:30:00",
                "pending_timeout_s": 60,
                "gpus_per_node": gpus,
            },
        },
        "runtime": {"kind": "process"},
        "server": {"tp_size": 8 * len(nodes), "ep_size": 8 * len(nodes)},
    }


# An allocation in these states was released: scancel was accepted and slurmd is ending its
# steps (COMPLETING lasts up to Slurm's KillWait, 30 s by default, longer on a loaded machine).
RELEASED_STATES = ("COMPLETING", "COMPLETED", "CANCELLED")


def slurm_left(run_id: str) -> list[str]:
    """Allocations and steps of `run_id` still held in squeue (names `servesweep-...-<run>-...`),
    not counting an allocation already released (RELEASED_STATES)."""
    found = []
    for alloc in squeue_jobs():
        if f"-{run_id}-" in alloc.name and alloc.state not in RELEASED_STATES:
            found.append(f"allocation {alloc.job_id} {alloc.name} {alloc.state}")
            found += [f"step {s} {n}" for s, n in squeue_steps(alloc.job_id).items()]
    return found


def cancel_ours(run_id: str) -> None:
    """Teardown safety net: scancel the allocations this scenario's run made (by job id)."""
    for alloc in squeue_jobs():
        if f"-{run_id}-" in alloc.name:
            subprocess.run(["scancel", alloc.job_id], capture_output=True, timeout=60)


@pytest.fixture()
def make_slurm_run(
    tmp_path: Path, shim: FaultShim, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Run]]:
    """Runs of a slice of the suite's matrix on Slurm: `make_slurm_run(WITHIN, nodes=[...])`;
    afterwards, what they left (allocations, processes on their port) is ended."""
    runs: list[Run] = []
    name = request.node.name.removeprefix("test_").replace("_", "-")[:20]

    def make(
        layout: dict[str, Any], *, nodes: list[str], gpus: int | None = 0, **extra: Any
    ) -> Run:
        workdir = tmp_path / f"w{len(runs)}"
        workdir.mkdir()
        config = slurm_config(unique_run_id(name), shim, nodes=nodes, gpus=gpus, **layout)
        run = Run.create(workdir, deep_update(config, extra))
        runs.append(run)
        return run

    yield make
    for run in runs:
        cancel_ours(run.run_id)
        kill_local_leftovers(run.port)


def servesweep(run: Run, *args: str) -> subprocess.CompletedProcess[str]:
    """The servesweep CLI in the run's directory, on its config."""
    code = "import sys; from servesweep.workflow.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args, "--configfile", str(run.config)],
        capture_output=True,
        text=True,
        cwd=run.workdir,
        env=run.full_env(),
        timeout=600,
    )


def node_log(run: Run, backend: str, node: str) -> Path:
    """Rank 0's log on its node (the nodes are this machine), where it is written as it runs."""
    owner = current_owner(run.workdir / "results")
    return Path(owner_dir(owner.tag)) / run.run_id / server_id(backend) / f"{node}.log"


def run_during_hang_on(
    run: Run, shim: FaultShim, node: str, act: Callable[[subprocess.Popen[str]], None]
) -> subprocess.CompletedProcess[str]:
    """harness.run_during_hang, the hang seen in rank 0's log on its Slurm node."""
    shim.inject(TARGET, f"--sim-hang-at {SECOND_CELL_INDEX}")
    proc = run.start()
    try:
        wait_for(
            file_contains(node_log(run, TARGET, node), HANG_MARKER),
            limit_s=300,
            what=f"request #{SECOND_CELL_INDEX} to hang",
        )
        act(proc)
        out, err = proc.communicate(timeout=SNAKEMAKE_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            kill_group(proc, signal.SIGKILL)
            proc.communicate()
    shim.clear()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# ---------------------------------------------------------------- a service of `up`


def test_service_reused_by_a_run_under_another_run_id(
    checks: Checks, make_slurm_run: Callable[..., Run]
) -> None:
    checks.scenario(
        "Slurm: `servesweep up` starts a service; a run under another RUN_ID reuses it "
        "(docs/access.md), then `servesweep down` gives its allocation back"
    )
    # The service asks for the node's GPUs: the later run cannot get an allocation of its own.
    run = make_slurm_run({"backends": (TARGET,), "concurrencies": (2,)}, nodes=["node3"], gpus=None)
    later = f"{run.run_id}-later"
    try:
        up = servesweep(run, "up")
        checks.check("`servesweep up` succeeds", up.returncode == 0, output(up)[-3000:])
        held = slurm_left(run.run_id)
        checks.check("the service holds its allocation and step", len(held) >= 2, str(held))
        check_later_run_reuses_the_service(checks, run, later)
        checks.check(
            "the later run left no allocation of its own",
            not slurm_left(later),
            str(slurm_left(later)),
        )
    finally:
        down = servesweep(run, "down")
    checks.check("`servesweep down` succeeds", down.returncode == 0, output(down)[-3000:])
    wait_for(lambda: not slurm_left(run.run_id), 60, "the service's allocation to go")


# ---------------------------------------------------------------- the allocation is lost


LOST = {
    # fault -> (what Slurm says, seconds a hung request waits: the fault must come first)
    "scancel": (r"CANCELLED", 4),
    "time_limit": (
        r"TIMEOUT, reason TimeLimit; slurmstepd\S*: error: \*\*\* STEP .*TIME LIMIT",
        150,
    ),
}


@pytest.mark.parametrize("fault", sorted(LOST))
def test_allocation_lost_mid_cell(
    fault: str,
    checks: Checks,
    make_slurm_run: Callable[..., Run],
    shim: FaultShim,
    reference: pd.DataFrame,
) -> None:
    how = {"scancel": "cancelled (scancel)", "time_limit": "past its time limit"}[fault]
    checks.scenario(
        f"Slurm: the run's allocation is {how} mid-cell: Slurm's state and reason in the "
        "error, the server's log brought back"
    )
    said, wait_s = LOST[fault]
    run = make_slurm_run(WITHIN, nodes=["node2"], workload=workload(request_timeout_s=wait_s))

    def lose(_: subprocess.Popen[str]) -> None:
        [alloc] = [a for a in squeue_jobs() if f"-{run.run_id}-" in a.name]
        if fault == "scancel":
            argv = ["scancel", alloc.job_id]
        else:  # the limit is passed at once; slurmctld ends the job at its next check
            argv = ["scontrol", "update", f"JobId={alloc.job_id}", "TimeLimit=0:01"]
        subprocess.run(argv, check=True, timeout=60)
        checks.note(f"{' '.join(argv)} ({alloc.name})")

    proc = run_during_hang_on(run, shim, "node2", lose)
    line = check_stopped_cleanly(
        checks,
        run,
        proc,
        cause=rf"ServerDied: .*exited \(Slurm: job \d+ {said}",
        node=r"node node2\b",
        finished=1,
    )
    logs = [Path(p) if Path(p).is_absolute() else run.workdir / p for p in log_paths(line)]
    texts = [p.read_text(errors="replace") for p in logs if p.is_file()]
    checks.check(
        "the log it names holds the server's own lines (not empty)",
        any("fired up and ready" in t for t in texts),
        f"{logs}: {[t[-300:] for t in texts]}",
    )
    checks.check("nothing of the run is left in squeue", not slurm_left(run.run_id))
    rerun_and_check(checks, run, reference)
    checks.check("nothing of the rerun is left in squeue", not slurm_left(run.run_id))


# ---------------------------------------------------------------- `down` after a SIGKILL


def test_down_after_snakemake_is_sigkilled(
    checks: Checks, make_slurm_run: Callable[..., Run], shim: FaultShim
) -> None:
    checks.scenario(
        "Slurm: snakemake is SIGKILLed mid-cell (no handler runs), then `servesweep down` "
        "gives the allocation back"
    )
    # A long request timeout keeps the killed run's client step alive when down runs.
    run = make_slurm_run(WITHIN, nodes=["node1"], workload=workload(request_timeout_s=60))
    proc = run_during_hang_on(run, shim, "node1", lambda p: kill_group(p, signal.SIGKILL))
    checks.check(
        "snakemake died of SIGKILL", proc.returncode == -signal.SIGKILL, str(proc.returncode)
    )
    held = slurm_left(run.run_id)
    checks.check("the allocation and its steps outlive snakemake", bool(held), str(held))
    down = servesweep(run, "down")
    checks.check("`servesweep down` succeeds", down.returncode == 0, output(down)[-3000:])
    checks.message(down.stdout.strip().splitlines()[-1] if down.stdout.strip() else "")
    left = slurm_left(run.run_id)
    checks.check("nothing of the run is left in squeue", not left, "\n".join(left))
    checks.check("no server or client process is left", not run.leftovers(), str(run.leftovers()))


# ---------------------------------------------------------------- the head's folder, planted


def test_head_folder_planted_by_another_user(
    checks: Checks, make_slurm_run: Callable[..., Run], tmp_path: Path
) -> None:
    checks.scenario(
        "Slurm: another user pre-creates the head's folder (servesweep-slurm-<uid>, 0777) with "
        "a link named after a server's step and the allocation's lock held"
    )
    # The run's temp folder ($TMPDIR) is the test's: other runs' folder in /tmp stays as is.
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    env = {"TMPDIR": str(shared)}
    run = make_slurm_run(WITHIN, nodes=["node2"])
    exp = load_experiment(yaml.safe_load(run.config.read_text()), {})
    owner = current_owner(run.workdir / "results")
    nobody = pwd.getpwnam("nobody")
    planted = shared / f"servesweep-slurm-{os.getuid()}"  # the head's folder, in its TMPDIR
    planted.mkdir()
    planted.chmod(0o777)
    victim = tmp_path / "victim"
    victim.write_text("root's file\n")
    links = []
    for spec in server_specs(exp):
        step = f"servesweep-{owner.tag}-{run.run_id}-{spec.fingerprint}-server-r0"
        link = planted / f"{step}.srun.log"
        link.symlink_to(victim)
        links.append(link)
    alloc = allocation_name(owner_tag=owner.tag, run_id=run.run_id, nodes=["node2"])
    lock = planted / f"{alloc}.lock"
    lock.write_text("")
    for path in (planted, lock, *links):
        os.chown(path, nobody.pw_uid, nobody.pw_gid, follow_symlinks=False)
    # The lock held by that user (one process: setpriv and flock -F exec, no fork).
    as_nobody = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}"]
    holder = subprocess.Popen(
        [*as_nobody, "--clear-groups", "flock", "-F", str(lock), "sleep", "600"],
        stdin=subprocess.DEVNULL,
    )
    try:
        proc = run.snakemake(env=env)
    finally:
        holder.kill()
        holder.wait()
    text = output(proc)
    checks.check("the run exits non-zero", proc.returncode != 0, f"exit {proc.returncode}")
    lines = error_lines(text)
    checks.check("a one-line `servesweep: <Kind>: ...` error is printed", bool(lines), text[-3000:])
    checks.message(lines[0])
    checks.check("the error names the planted folder", str(planted) in lines[0], lines[0])
    checks.check("no traceback", "Traceback" not in text, text[-3000:])
    checks.check("the link's target is never written", victim.read_text() == "root's file\n")
    checks.check(
        "the links and the lock are left as planted (nothing written through them)",
        all(p.is_symlink() for p in links) and lock.read_text() == "",
    )
    checks.check("no allocation was made", not slurm_left(run.run_id), str(slurm_left(run.run_id)))
    checks.check("no cell ran", not run.started(), str(run.started()))


# ---------------------------------------------------------------- GPUs are Slurm's to bind


def test_gpu_ids_under_slurm_refused(checks: Checks, make_slurm_run: Callable[..., Run]) -> None:
    checks.scenario(
        "Slurm: cluster.gpu_ids is set (it would override the GPUs Slurm binds to each step: "
        "CUDA_VISIBLE_DEVICES=0,1 while Slurm gave 6,7)"
    )
    run = make_slurm_run(
        WITHIN,
        nodes=["node1"],
        gpus=2,
        cluster={"gpus_per_node": 2, "gpu_ids": {"node1": [0, 1]}},
        server={"tp_size": 2, "ep_size": 2},
    )
    proc = run.snakemake()
    text = output(proc)
    checks.check("the run exits non-zero", proc.returncode != 0, f"exit {proc.returncode}")
    lines = error_lines(text)
    checks.check("a one-line `servesweep: <Kind>: ...` error is printed", bool(lines), text[-3000:])
    checks.message(lines[0])
    checks.check(
        "the error names cluster.gpu_ids and Slurm", "gpu_ids" in lines[0] and "slurm" in lines[0]
    )
    checks.check("no allocation was made", not slurm_left(run.run_id), str(slurm_left(run.run_id)))
    checks.check("no cell ran", not run.started(), str(run.started()))
