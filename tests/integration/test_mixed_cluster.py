"""A cluster whose first node is this machine and whose other node is reached over SSH, as seed
003 runs from node 601 itself (`cluster.local_nodes`)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from servesweep.cluster.access import connected
from servesweep.config.load import load_experiment_file
from servesweep.core.events import read_events
from tests.helpers import REPO, experiment_file, run_snakemake
from tests.integration.nodes import ADDRESSES, sim_in_docker

pytestmark = pytest.mark.integration

HERE = "here"  # no ssh alias: only `local_nodes` makes it reachable


def _config(nodes_dir: Path, run_id: str) -> dict:
    return {
        "run_id": run_id,
        "cluster": {
            "transport": "ssh",
            "nodes": [HERE, "node2"],
            "local_nodes": [HERE],
            "addresses": {HERE: "127.0.0.1", "node2": ADDRESSES["node2"]},
            "ssh": {"config_file": str(nodes_dir / "ssh_config")},
            "gpus_per_node": 8,
        },
        "runtime": sim_in_docker(REPO),
        "engine": {
            "python": "python3",
            "ready_timeout_s": 120,
            "sim": {"time_scale": 0.001, "startup_s": 5},
        },
        "server": {"tp_size": 16, "ep_size": 16},
        "matrix": {
            "server": {"moe_runner_backend": ["marlin"], "chunked_prefill_size": [8192]},
            "client": {"concurrency": [4]},
        },
        "workload": {"input_len": 2048, "num_requests": 8},
        "repeats": 1,
    }


def test_a_local_node_runs_here_and_the_other_over_ssh(tmp_path: Path, nodes_dir: Path) -> None:
    cfg = experiment_file(tmp_path, _config(nodes_dir, "it-mixed-probe"))
    exp = load_experiment_file(cfg, {})
    with connected(exp) as cluster:
        cluster.transport.check_reachable()
        seen = {
            node: cluster.transport.run(node, "echo ssh=${SSH_CONNECTION:-none}", timeout=30)
            for node in exp.cluster.nodes
        }
    assert seen[HERE].check("echo").stdout.strip() == "ssh=none"  # run here, no SSH
    assert seen["node2"].check("echo").stdout.strip().startswith("ssh=127.")


def test_a_run_on_a_mixed_cluster(tmp_path: Path, nodes_dir: Path, docker_node: str) -> None:
    run_id = f"it-mixed-{uuid.uuid4().hex[:6]}"  # its own: leftovers are its own
    cfg = experiment_file(tmp_path, _config(nodes_dir, run_id))
    # up to results.csv: the cell and its servers' logs are what this checks, not the analysis
    table = f"results/{run_id}/results.csv"
    proc = run_snakemake(tmp_path, "--cores", "1", table, "--configfile", str(cfg))
    assert proc.returncode == 0, proc.stderr[-4000:]
    run_dir = tmp_path / "results" / run_id
    [raw] = list(run_dir.glob("raw/*/*/r1.jsonl"))
    record = json.loads(raw.read_text())
    assert record["completed"] == 8
    events = [e for _, e, _ in read_events(run_dir / "orchestrator.log")]
    assert events.count("start") == 1 and "ready" in events
    # both nodes' logs came back into the run folder, one per node
    logs = sorted(p.name for p in run_dir.glob("service/*/*.log") if p.name != "warmup.log")
    assert logs == [f"{HERE}.log", "node2.log"], logs
