"""The workflow on four SSH nodes with docker, the sim multi-node, and sudo as `sweeper`."""

from __future__ import annotations

import json
import math
import os
import subprocess
import threading
import uuid
from pathlib import Path

import pandas as pd
import pytest
import yaml

from servesweep.cluster.ssh import SshTransport
from servesweep.core.events import read_events
from tests.helpers import REPO, experiment_file, run_snakemake, two_configs_one_cell
from tests.integration.nodes import NODES, sim_in_docker, ssh_cluster

pytestmark = pytest.mark.integration

SWEEPERS = [f"{n}-sweeper" for n in NODES]


def _config(nodes_dir: Path, run_id: str, **extra: object) -> dict:
    runtime = sim_in_docker(
        REPO,
        sudo=True,
        smoke=["python3 -m servesweep.sim --help > /dev/null && echo sim importable"],
        checks=[
            {
                "name": "python-version",
                "command": "python3 -c 'import sys; print(sys.version_info[0])'",
                "expect": "^3$",
            }
        ],
    )
    runtime.update(extra.pop("runtime", {}))
    return {
        "run_id": run_id,
        "cluster": ssh_cluster(nodes_dir, SWEEPERS, gpus_per_node=8),
        "runtime": runtime,
        "engine": {
            "python": "python3",
            "ready_timeout_s": 120,
            "sim": {"time_scale": 0.001, "startup_s": 5},
        },
        "server": {"tp_size": 32, "ep_size": 32},
        "telemetry": {"gpu_interval_ms": 200},
        **two_configs_one_cell(),
        "repeats": 1,
        **extra,
    }


def _run_as_sweeper(
    workdir: Path, cfg: Path, password_file: Path
) -> subprocess.CompletedProcess[str]:
    """`snakemake --cores 1 all` with the sweeper's sudo password in a file."""
    return run_snakemake(
        workdir,
        "--cores",
        "1",
        "all",
        "--configfile",
        str(cfg),
        env={"SUDO_PASSWORD_FILE": str(password_file)},
    )


@pytest.fixture()
def password_file(tmp_path: Path, sweeper_password: str) -> Path:
    path = tmp_path / "sudo-password"
    path.write_text(sweeper_password + "\n")
    path.chmod(0o600)
    return path


class ProcessWatch(threading.Thread):
    """Scans every process's argv and environment for a secret while a run goes on."""

    def __init__(self, secret: str) -> None:
        super().__init__(daemon=True)
        self.secret = secret.encode()
        self.hits: list[str] = []
        self.scans = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            for proc in Path("/proc").glob("[0-9]*"):
                for name in ("cmdline", "environ"):
                    try:
                        if self.secret in (proc / name).read_bytes():
                            self.hits.append(f"{proc.name}/{name}")
                    except OSError:
                        continue
            self.scans += 1
            self.done.wait(0.05)


def test_sudo_really_asks_for_the_password(ssh: SshTransport) -> None:
    res = ssh.run("node1-sweeper", "sudo -n docker ps", timeout=30)
    assert res.returncode != 0
    assert "password is required" in res.stderr


def test_matrix_over_ssh_docker_with_sudo(
    tmp_path: Path,
    nodes_dir: Path,
    docker_node: str,
    sweeper_password: str,
    password_file: Path,
    ssh: SshTransport,
) -> None:
    run_id = f"it-cluster-{uuid.uuid4().hex[:6]}"  # its own: leftovers are its own
    cfg = experiment_file(tmp_path, _config(nodes_dir, run_id))
    watch = ProcessWatch(sweeper_password)
    watch.start()
    try:
        proc = _run_as_sweeper(tmp_path, cfg, password_file)
    finally:
        watch.done.set()
        watch.join()
    assert proc.returncode == 0, proc.stderr[-4000:]
    run_dir = tmp_path / "results" / run_id

    # One image check per node (all at once, keyed by the image), with smoke and check output.
    [images] = (tmp_path / "results" / ".images").iterdir()
    for node in SWEEPERS:
        evidence = yaml.safe_load((images / f"{node}.json").read_text())
        assert evidence["image_id"].startswith("sha256:")
        assert evidence["image_key"] == images.name
        assert evidence["smoke"][-1]["output"] == "sim importable"
        assert evidence["checks"] == [
            {
                "name": "python-version",
                "command": "python3 -c 'import sys; print(sys.version_info[0])'",
                "expect": "^3$",
                "returncode": 0,
                "output": "3",
                "matched": True,
                "guess": False,
            }
        ]
        # Every launch command parsed in the image by its own parser, before any start.
        assert evidence["launch_commands_parsed"] > 0
        assert evidence["packages"]["sglang"] is None  # the sim's image holds no SGLang
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert [i["node"] for i in manifest["images"]] == SWEEPERS
    assert all(i["checks"][0]["output"] == "3" for i in manifest["images"])
    assert all(i["evidence"]["image_key"] == images.name for i in manifest["images"])
    # A new run id with the same image builds nothing.
    again = run_snakemake(
        tmp_path, "-n", "all", "--configfile", str(cfg), env={"RUN_ID": "it-cluster-again"}
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert "build_images" not in again.stdout and "preflight" in again.stdout
    # Exact docker commands per node, multi-node flags, labels; logs of every node collected.
    service = run_dir / "service" / "moe_runner_backend~marlin,chunked_prefill_size~8192"
    commands = (service / "commands.sh").read_text()
    assert commands.count("sudo -S -p '' docker run -d") == 4
    assert "--node-rank 3" in commands and "--dist-init-addr 127.0.0.2:" in commands
    assert "--label servesweep.fingerprint=" in commands
    for node in SWEEPERS[1:]:
        assert (service / f"{node}.log").stat().st_size > 0
    assert "The server is fired up" in (service / f"{SWEEPERS[0]}.log").read_text()
    # GPU snapshots from every node (fake nvidia-smi replaying the recorded H200 output).
    gpu = pd.read_csv(next(run_dir.glob("gpu/*/*/r1.csv")))
    snapshots = gpu[gpu["phase"].isin(["before", "after"])]
    assert set(snapshots["node"]) == set(SWEEPERS)
    assert set(snapshots["status"]) == {"ok"}
    assert len(snapshots) == 2 * 4 * 8
    # The sampling loop of every node (the fake replays the recorded H200 series) and the window.
    samples = gpu[gpu["phase"] == "sample"]
    assert set(samples["node"]) == set(SWEEPERS) and set(samples["status"]) == {"ok"}
    assert set(samples["uuid"]) == {"GPU-a319b8c1-9529-e6f5-1389-3c77af651019"}
    assert list(gpu[gpu["phase"].str.startswith("window")]["phase"]) == [
        "window-start",
        "window-end",
    ]
    results = pd.read_csv(run_dir / "results.csv")
    assert len(results) == 2
    assert set(results["gpu_source"]) == {"measured"}
    # 32 GPUs between the series' idle (79.2 W) and loaded (692.5 W) power, energy > 0
    assert results["gpu_power_mean_w"].between(32 * 79, 32 * 693).all()
    assert (results["gpu_energy_j"] > 0).all()
    # A cell here lasts ~10 ms, less than the 200 ms interval: figures of samples inside the
    # window (memory, utilisation) may have none; energy and mean power interpolate the edges.
    memory = results["gpu_mem_used_peak_mib"]
    assert (memory.isna() | memory.isin([0, 655, 1139])).all()
    assert (results["gpu_count"] == 32).all()
    events = [e for _, e, _ in read_events(run_dir / "orchestrator.log")]
    assert events.count("start") == 2 and events.count("ready") == 2

    # Nothing left running.
    left = ssh.run(docker_node, f"docker ps -aq --filter label=servesweep.run={run_id}", timeout=30)
    assert left.ok and left.stdout.strip() == ""
    # The password is nowhere: files, process argv/environment during the run.
    assert watch.scans > 10 and watch.hits == []
    secret = sweeper_password.encode()
    for root in (run_dir, tmp_path / ".snakemake"):
        for path in root.rglob("*"):
            if path.is_file():
                assert secret not in path.read_bytes(), f"password leaked into {path}"
    assert sweeper_password not in proc.stdout + proc.stderr


def test_failed_smoke_aborts_before_any_server_starts(
    tmp_path: Path, nodes_dir: Path, docker_node: str, password_file: Path
) -> None:
    run_id = f"it-smoke-{uuid.uuid4().hex[:6]}"  # its own: leftovers are its own
    cfg = experiment_file(
        tmp_path, _config(nodes_dir, run_id, runtime={"smoke": ["echo broken kernel; exit 3"]})
    )
    proc = _run_as_sweeper(tmp_path, cfg, password_file)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "SmokeFailed" in out and "exit 3" in out
    assert "results/.images/" in out
    run_dir = tmp_path / "results" / run_id
    images = tmp_path / "results" / ".images"
    assert not list(images.glob("*/*.json"))
    events = [e for _, e, _ in read_events(run_dir / "orchestrator.log")]
    assert "start" not in events
    assert "broken kernel" in "".join(p.read_text() for p in images.glob("*/*.log"))


def test_unsafe_password_file_is_refused_before_anything_starts(
    tmp_path: Path, nodes_dir: Path, docker_node: str, password_file: Path
) -> None:
    password_file.chmod(0o644)
    cfg = experiment_file(tmp_path, _config(nodes_dir, "it-badfile"))
    proc = _run_as_sweeper(tmp_path, cfg, password_file)
    assert proc.returncode != 0
    assert "SecretError" in proc.stdout + proc.stderr
    assert not (tmp_path / "results" / "it-badfile" / "orchestrator.log").exists()


def test_bench_serving_client_runs_in_the_image(
    tmp_path: Path, nodes_dir: Path, docker_node: str, staged_bench: Path, tokenizer_dir: Path
) -> None:
    """SGLang's own bench_serving in a one-shot container on the client node; record copied
    back and validated like the builtin client's."""
    run_id = f"it-bench-{uuid.uuid4().hex[:6]}"  # its own: leftovers are its own
    config = _config(nodes_dir, run_id)
    config["cluster"] = ssh_cluster(nodes_dir, ["node1"], gpus_per_node=8)
    runtime = config["runtime"]
    runtime["sudo"] = False
    runtime["mounts"] += [f"{p}:{p}:ro" for p in (staged_bench, tokenizer_dir)]
    runtime["env"]["PYTHONPATH"] = f"{staged_bench}:{runtime['env']['PYTHONPATH']}"
    config["server"] = {"tp_size": 8, "ep_size": 8}
    config["matrix"]["server"]["moe_runner_backend"] = ["marlin"]
    config["client"] = {"kind": "bench_serving", "tokenizer": str(tokenizer_dir)}
    cfg = experiment_file(tmp_path, config)
    table = f"results/{run_id}/results.csv"  # the record and its row: no analysis after it
    proc = run_snakemake(tmp_path, "--cores", "1", table, "--configfile", str(cfg))
    assert proc.returncode == 0, proc.stderr[-4000:]
    run_dir = tmp_path / "results" / run_id
    [raw] = run_dir.glob("raw/*/*/r1.jsonl")
    record = json.loads(raw.read_text())
    assert record["backend"] == "sglang" and "client" not in record, "bench_serving's record"
    assert record["completed"] == 8 and record["total_input_tokens"] == 8 * 2048
    bench_log = run_dir / "bench" / raw.relative_to(run_dir / "raw").with_suffix(".log")
    assert "Serving Benchmark Result" in bench_log.read_text()
    # the wrapper's figures of bench_serving's process, measured from outside (loadgen.usage)
    assert bench_log.read_text().splitlines()[-1].startswith("servesweep-client-usage: ")
    assert record["servesweep_client_process"]["returncode"] == 0
    [row] = pd.read_csv(run_dir / "results.csv").to_dict("records")
    assert row["client_process_wall_s"] > 0 and row["client_process_cpu_s"] > 0
    assert 0 < row["client_process_cpu_pct"] <= 100 * os.cpu_count()
    assert math.isnan(row["client_cpu_pct"])  # bench_serving has no in-window self-check
    assert row["client_saturated"] == (row["client_process_cpu_pct"] >= 90)
