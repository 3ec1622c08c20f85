"""Slurm on the single-machine cluster of .ci/setup_slurm.sh (proctrack/cgroup): servers as job
steps, the cluster enforcing step lifetime, faults as one line with nothing left, and the
default matrix through snakemake. Skips locally without that cluster; fails when
SERVESWEEP_REQUIRE_SLURM is set (.ci/run). Each test has its own run id, ports and nodes' checks
scoped to its own allocation names (safe beside other tests)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from servesweep.cluster.access import open_cluster
from servesweep.cluster.runtime import Launch, ProcessRuntime
from servesweep.cluster.slurm import SlurmTransport, squeue_jobs, squeue_steps
from servesweep.config.load import load_experiment
from servesweep.config.matrix import server_specs
from servesweep.config.paths import RunPaths
from servesweep.core.errors import ServerDied, TransportError
from servesweep.serving.servers import ServerManager, shutdown
from tests.helpers import REPO, deep_update, free_port, run_snakemake, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slurm]

SLURM_DEFAULT = REPO / "config" / "experiments" / "default_slurm_local.yaml"
HINT = "run `bash .ci/setup_slurm.sh` as root first"


@pytest.fixture(scope="module", autouse=True)
def slurm_cluster() -> None:
    """The single-machine cluster answers with idle/mixed nodes node1..node4."""
    why = None
    if shutil.which("sinfo") is None:
        why = "no sinfo on PATH"
    else:
        res = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=30
        )
        nodes = dict(line.split() for line in res.stdout.splitlines() if line.strip())
        if res.returncode != 0 or not {"node1", "node2", "node3", "node4"} <= set(nodes):
            why = f"sinfo: {(res.stderr or res.stdout).strip()[-200:] or 'no node1..node4'}"
    if why is not None:
        message = f"single-machine Slurm unavailable: {why}; {HINT}"
        if os.environ.get("SERVESWEEP_REQUIRE_SLURM"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def _raw(run_id: str, **changes: Any) -> dict[str, Any]:
    raw = yaml.safe_load(SLURM_DEFAULT.read_text())
    raw = deep_update(
        raw,
        {
            "run_id": run_id,
            "engine": {
                "port": free_port(),
                "dist_init_port": free_port(),
                "sim": {"time_scale": 0.002, "startup_s": 5},
            },
            # No GPU asked: tests on one node run side by side (pytest-xdist).
            "cluster": {"slurm": {"pending_timeout_s": 20, "gpus_per_node": 0}},
        },
    )
    return deep_update(raw, changes)


def _exp(run_id: str, **changes: Any):
    return load_experiment(_raw(run_id, **changes), {})


def _left(run_id: str) -> list[str]:
    """This run's allocations and steps still in squeue."""
    jobs = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True).stdout
    steps = subprocess.run(["squeue", "-h", "-s", "-o", "%j"], capture_output=True, text=True)
    return [n for n in (jobs + steps.stdout).split() if f"-{run_id}-" in n]


def test_a_process_left_by_a_short_step_dies_with_the_step(tmp_path: Path) -> None:
    """The plain process runtime (setsid from a command) does not survive under Slurm's
    proctrack/cgroup: why every server rank is its own step."""
    run_id = f"it-slurm-escape-{uuid.uuid4().hex[:6]}"
    exp = _exp(run_id, cluster={"nodes": ["node2"]})
    transport = SlurmTransport(exp, results_root=tmp_path)
    try:
        launch = Launch(
            name="escape", node="node2", argv=["sleep", "300"], log_path=str(tmp_path / "x.log")
        )
        pid = ProcessRuntime(transport).start(launch)
        assert pid.isdigit()
        assert wait_until(lambda: not Path(f"/proc/{pid}").exists(), 20), (
            f"pid {pid} outlived its step: is ProctrackType proctrack/cgroup?"
        )
    finally:
        _release(exp, tmp_path)
    assert wait_until(lambda: _left(run_id) == [], 30), _left(run_id)


def test_the_gpu_sampling_loop_lives_in_a_step_of_its_own_until_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cell's nvidia-smi loop is started in the background; under proctrack/cgroup a short
    step would take it down at once (energy `unavailable` on every Slurm site). It samples
    until the sampler stops it, and nothing of it is left in squeue."""
    from servesweep.cluster import gpusampling

    run_id = f"it-slurm-gpuloop-{uuid.uuid4().hex[:6]}"
    exp = _exp(run_id, cluster={"nodes": ["node3"]})
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"  # srun passes the head's PATH to the step
    line = "GPU-x, 691.33, 700.00, 100, 25, 1139, 143771, 1440, 3201, 57, P0"
    fake.write_text(
        "#!/bin/sh\n"
        "while :; do now=$(date '+%Y/%m/%d %H:%M:%S.%3N'); "
        f'echo "$now, 0, {line}"; sleep 0.05; done\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    transport = SlurmTransport(exp, results_root=tmp_path)
    try:
        sampler = gpusampling.NvidiaSmiSampler(
            transport=transport,
            nodes=["node3"],
            interval_ms=50,
            remote_dir=str(tmp_path / "gpu"),
            max_s=60,
        )
        sampler.start()
        assert set(sampler.pids) == {"node3"}, sampler.rows
        assert len(_steps(run_id)) == 1  # the loop's own step, held while it samples
        # 15 samples of 50 ms (under 1 s idle), however long a loaded machine takes to write
        # them: a loop that died with a short step leaves at most one or two, and the wait gives
        # up (a bound, not a timed assert). A fixed 2 s asked for rounds (two forks and a 50 ms
        # sleep) under 133 ms, which a loaded machine need not give.
        out = Path(sampler._out("node3"))

        def written() -> int:
            return out.read_bytes().count(b"\n") if out.is_file() else 0

        assert wait_until(lambda: written() >= 15, 60), f"{written()} samples written"
        rows = sampler.stop()
        assert len(rows) >= 15 and {r["status"] for r in rows} == {"ok"}, rows[:3]
        print(f"{len(rows)} samples")
        assert wait_until(lambda: _steps(run_id) == [], 20), _steps(run_id)  # the step ended
    finally:
        transport.close()
        _release(exp, tmp_path)
    assert wait_until(lambda: _left(run_id) == [], 30), _left(run_id)


def _steps(run_id: str) -> list[str]:
    """This run's job steps still in squeue (`JOB.STEP` ids of its allocations)."""
    return [
        step
        for alloc in squeue_jobs()
        if f"-{run_id}-" in alloc.name
        for step in squeue_steps(alloc.job_id)
    ]


def _release(exp, root: Path) -> None:
    from servesweep.cluster.slurm import release_allocations

    release_allocations(exp, results_root=root)


def test_a_pending_allocation_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    holder = f"it-slurm-holder-{uuid.uuid4().hex[:6]}"
    subprocess.run(
        ["salloc", "--no-shell", f"--job-name={holder}", "-N1", "-w", "node4", "--gres=gpu:8",
         "--immediate=20", "-t", "5"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    run_id = f"it-slurm-pending-{uuid.uuid4().hex[:6]}"
    try:
        exp = _exp(
            run_id,
            cluster={"nodes": ["node4"], "slurm": {"pending_timeout_s": 2, "gpus_per_node": 8}},
        )
        with pytest.raises(TransportError) as err:
            SlurmTransport(exp, results_root=tmp_path).run("node4", "true", timeout=30)
        message = str(err.value)
        assert "\n" not in message
        assert "not granted within 2s" in message and "node4" in message
    finally:
        subprocess.run(["scancel", "-n", holder], timeout=30)
    assert _left(run_id) == []  # the withdrawn request is gone at once


def _manager(run_id: str, tmp_path: Path, **changes: Any) -> ServerManager:
    exp = _exp(run_id, **changes)
    paths = RunPaths(tmp_path / "results" / run_id)
    os.chdir(tmp_path)  # the owner (and allocation name) of results/ under tmp_path
    return ServerManager(exp, paths, cluster=open_cluster(exp))


@pytest.fixture
def in_tmp(tmp_path: Path):
    cwd = os.getcwd()
    yield tmp_path
    os.chdir(cwd)


def test_server_is_a_step_and_a_killed_head_srun_is_one_line(in_tmp: Path) -> None:
    run_id = f"it-slurm-kill-{uuid.uuid4().hex[:6]}"
    manager = _manager(run_id, in_tmp, cluster={"nodes": ["node3"]})
    spec = server_specs(manager.exp)[0]
    try:
        state = manager.start(spec)
        handle = state.ranks[0].handle
        step, pid = handle.split(":")
        steps = subprocess.run(["squeue", "-h", "-s", "-o", "%i"], capture_output=True, text=True)
        assert step in steps.stdout.split()
        commands = (manager.paths.service(spec.id) / "commands.sh").read_text()
        assert "srun --jobid=" in commands and " --overlap " in commands
        manager.check_alive(state)
        os.kill(int(pid), signal.SIGKILL)  # the server's head-side srun
        with pytest.raises(ServerDied) as err:
            assert wait_until(lambda: not manager.runtime.is_running("node3", handle), 10)
            manager.check_alive(state)
        assert "\n" not in str(err.value) and "node node3" in str(err.value)
    finally:
        shutdown(manager.exp, manager.paths, reason="test")
    assert wait_until(lambda: _left(run_id) == [], 30), _left(run_id)


def test_scancel_of_the_allocation_mid_run_is_one_line(in_tmp: Path) -> None:
    run_id = f"it-slurm-scancel-{uuid.uuid4().hex[:6]}"
    manager = _manager(run_id, in_tmp, cluster={"nodes": ["node4"]})
    spec = server_specs(manager.exp)[0]
    try:
        state = manager.start(spec)
        [alloc] = [a for a in squeue_jobs() if f"-{run_id}-" in a.name]
        subprocess.run(["scancel", alloc.job_id], check=True, timeout=30)
        with pytest.raises(ServerDied) as err:
            assert wait_until(
                lambda: not manager.runtime.is_running("node4", state.ranks[0].handle), 30
            )
            manager.check_alive(state)
        assert "\n" not in str(err.value)
    finally:
        shutdown(manager.exp, manager.paths, reason="test")
    assert wait_until(lambda: _left(run_id) == [], 30), _left(run_id)


def test_two_pools_at_once_two_allocations_nothing_left_nothing_to_rerun(tmp_path: Path) -> None:
    """Pools node1-2 and node3-4 (TP16 over two nodes each) run at once, each in its own
    allocation; every rank's commands.sh line is an srun step; nothing is left; a rerun has
    nothing to do."""
    run_id = f"it-slurm-wf-{uuid.uuid4().hex[:6]}"
    raw = _raw(
        run_id,
        cluster={"nodes": ["node1", "node2", "node3", "node4"], "nodes_per_server": 2,
                 "pools": [["node1", "node2"], ["node3", "node4"]]},
        server={"tp_size": 16, "ep_size": 16},
        matrix={
            "server": {"moe_runner_backend": ["marlin", "flashinfer_mxfp4"],
                       "chunked_prefill_size": [8192]},
            "client": {"concurrency": [4, 8]},
        },
        workload={"input_len": 2048, "num_requests": 8},
        repeats=1,
    )  # fmt: skip
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(yaml.safe_dump(raw, sort_keys=False))
    # up to results.csv: the allocations are the cells'; the analysis after it runs no step
    table = f"results/{run_id}/results.csv"
    proc = run_snakemake(tmp_path, "--cores", "2", table, "--configfile", str(cfg), timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    run = tmp_path / "results" / run_id
    assert len(list((run / "raw").rglob("r*.jsonl"))) == 4
    log = (run / "orchestrator.log").read_text()
    # each config's equivalence probe starts it; both its cells reuse it
    assert log.count(" start ") == 2 and log.count(" reuse ") == 4
    made = set()
    for job_log in (run / "logs").rglob("*.log"):
        made |= set(re.findall(r"slurm: allocation (\S+) is job", job_log.read_text()))
    assert sorted(m.rsplit("-", 1)[-1] for m in made) == ["node1+node2", "node3+node4"]
    commands = list((run / "service").glob("*/commands.sh"))
    assert len(commands) == 2
    for path in commands:
        ranks = [line for line in path.read_text().splitlines() if not line.startswith("#")]
        assert len(ranks) == 2 and all(r.startswith("srun --jobid=") for r in ranks)
    assert wait_until(lambda: _left(run_id) == [], 30), _left(run_id)
    # Nothing of the run under /tmp: the head's locks and srun logs, the nodes' run folders
    # (the nodes of this cluster are this machine).
    stays = sorted(Path("/tmp").glob(f"servesweep-*/*-{run_id}-*"))
    stays += sorted(Path("/tmp").glob(f"servesweep-*/{run_id}"))
    assert not stays, stays
    again = run_snakemake(tmp_path, "-n", table, "--configfile", str(cfg))
    assert "Nothing to be done" in again.stdout + again.stderr
    assert _left(run_id) == []


def test_ctrl_c_mid_cell_stops_the_steps_and_gives_the_allocation_back(tmp_path: Path) -> None:
    run_id = f"it-slurm-int-{uuid.uuid4().hex[:6]}"
    raw = _raw(
        run_id,
        cluster={"nodes": ["node2"]},
        matrix={
            "server": {"moe_runner_backend": ["marlin"], "chunked_prefill_size": [8192]},
            "client": {"concurrency": [4]},
        },
        workload={"input_len": 2048, "num_requests": 400},
        repeats=2,
    )
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(yaml.safe_dump(raw, sort_keys=False))
    exe = shutil.which("snakemake")
    assert exe
    proc = subprocess.Popen(
        [exe, "-s", str(REPO / "Snakefile"), "-d", str(tmp_path), "--cores", "1", "all",
         "--configfile", str(cfg)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    log = tmp_path / "results" / run_id / "orchestrator.log"
    try:
        assert wait_until(lambda: log.exists() and " ready " in log.read_text(), 120)
        time.sleep(1.0)  # the client step is measuring
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert " stop " in log.read_text().splitlines()[-1], log.read_text()[-500:]
    assert wait_until(lambda: _left(run_id) == [], 30), _left(run_id)


STAND_IN = """#!/bin/sh
# A stand-in for apptainer (not in Debian): `pull OUT SRC` writes OUT and counts the pull;
# `exec [--nv] [--bind B] IMAGE CMD...` runs CMD on the host (the sim needs no image).
case "$1" in
  pull) echo "$3" >> {count}; echo "sif of $3" > "$2" ;;
  exec) shift
        while [ "${{1#--}}" != "$1" ]; do [ "$1" = --bind ] && shift; shift; done
        shift; exec "$@" ;;
  *) echo "stand-in apptainer: unknown $*" >&2; exit 2 ;;
esac
"""


def test_an_apptainer_image_is_pulled_once_and_checked_on_every_node(tmp_path: Path) -> None:
    run_id = f"it-slurm-sif-{uuid.uuid4().hex[:6]}"
    bin_dir, pulls = tmp_path / "bin", tmp_path / "pulls"
    bin_dir.mkdir()
    (bin_dir / "apptainer").write_text(STAND_IN.format(count=pulls))
    (bin_dir / "apptainer").chmod(0o755)
    image = tmp_path / "images" / "sim.sif"
    raw = _raw(
        run_id,
        cluster={"nodes": ["node1", "node2"], "nodes_per_server": 1,
                 "pools": [["node1"], ["node2"]]},
        runtime={"kind": "apptainer", "image": str(image), "source": "docker://example.org/sim:1",
                 "checks": [{"name": "python", "command": "python3 -c 'print(6*7)'",
                             "expect": "^42$"}]},
        matrix={"server": {"moe_runner_backend": ["marlin"], "chunked_prefill_size": [8192]},
                "client": {"concurrency": [4]}},
        workload={"input_len": 2048, "num_requests": 8},
        repeats=1,
    )  # fmt: skip
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(yaml.safe_dump(raw, sort_keys=False))
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    table = f"results/{run_id}/results.csv"  # image, preflight, the cell: no analysis after it
    proc = run_snakemake(
        tmp_path, "--cores", "2", table, "--configfile", str(cfg), env=env, timeout=600
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert pulls.read_text().splitlines() == ["docker://example.org/sim:1"]  # once, not per node
    assert image.read_text() == "sif of docker://example.org/sim:1\n"
    [images] = (tmp_path / "results" / ".images").iterdir()
    evidence = {n: json.loads((images / f"{n}.json").read_text()) for n in ("node1", "node2")}
    assert sorted(e["method"] for e in evidence.values()) == ["imported", "present"]
    assert all(e["checks"][0]["matched"] for e in evidence.values())
    [commands] = (tmp_path / "results" / run_id / "service").glob("*/commands.sh")
    assert re.search(rf"apptainer exec --nv --bind \S+ {image} python3 ", commands.read_text())
    assert wait_until(lambda: _left(run_id) == [], 30), _left(run_id)


def _cli(cwd: Path, *args: str, run_id: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from servesweep.workflow.cli import main; sys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd, capture_output=True, text=True, timeout=300, env={**os.environ, "RUN_ID": run_id},
    )  # fmt: skip


def test_a_service_keeps_its_allocation_until_down(tmp_path: Path) -> None:
    """`servesweep up` leaves a step (and its allocation) up; status names both; down stops
    the step and cancels the allocation."""
    run_id = f"it-slurm-svc-{uuid.uuid4().hex[:6]}"
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(yaml.safe_dump(_raw(run_id, cluster={"nodes": ["node3"]}), sort_keys=False))
    try:
        up = _cli(tmp_path, "up", "--configfile", str(cfg), run_id=run_id)
        assert up.returncode == 0, up.stderr[-2000:]
        status = _cli(tmp_path, "status", "--configfile", str(cfg), run_id=run_id)
        first, *rows = status.stdout.splitlines()
        assert (
            first.startswith("slurm allocation servesweep-") and f"-{run_id}-node3: job " in first
        )
        assert "-server-r0" in first
        assert rows and re.search(r"handle=\d+\.\d+:\d+ .*running=True +uptime_s=\d+", rows[0])
        assert _left(run_id)  # the service holds its step and allocation
    finally:
        down = _cli(tmp_path, "down", "--configfile", str(cfg), run_id=run_id)
    assert down.returncode == 0, down.stderr[-2000:]
    assert wait_until(lambda: _left(run_id) == [], 30), _left(run_id)
