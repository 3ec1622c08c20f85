"""Two node pools over SSH + docker: node1-2 and node3-4 each run one server config at once."""

from __future__ import annotations

import collections
import threading
import uuid
from pathlib import Path

import pandas as pd
import pytest
import yaml

from servesweep.cluster.pools import node_overlaps
from servesweep.cluster.ssh import SshTransport
from servesweep.core.events import read_events
from tests.helpers import REPO, experiment_file, free_port, run_snakemake, two_configs_one_cell
from tests.integration.nodes import NODES, sim_in_docker, ssh_cluster

pytestmark = pytest.mark.integration


class LabelWatch(threading.Thread):
    """Samples the labels of the run's containers (node, pool, fingerprint) during the run."""

    def __init__(self, ssh: SshTransport, node: str, run_id: str) -> None:
        super().__init__(daemon=True)
        self.ssh, self.node, self.run_id = ssh, node, run_id
        self.samples: list[list[tuple[str, str, str]]] = []
        self.done = threading.Event()

    def run(self) -> None:
        fmt = (
            '{{.Label "servesweep.node"}} {{.Label "servesweep.pool"}} '
            '{{.Label "servesweep.fingerprint"}} {{.Label "servesweep.kind"}}'
        )
        command = f"docker ps --filter label=servesweep.run={self.run_id} --format '{fmt}'"
        while not self.done.is_set():
            res = self.ssh.run(self.node, command, timeout=30)
            rows = [line.split() for line in res.stdout.splitlines()]
            self.samples.append([(r[0], r[1], r[2]) for r in rows if r and r[-1] == "server"])
            self.done.wait(0.3)


def test_two_pools_over_ssh_and_docker(
    tmp_path: Path, nodes_dir: Path, docker_node: str, ssh: SshTransport
) -> None:
    run_id = f"it-pools-{uuid.uuid4().hex[:6]}"  # its own: leftovers are its own
    changes = {
        "run_id": run_id,
        "cluster": ssh_cluster(nodes_dir, NODES, gpus_per_node=8, nodes_per_server=2, pools="auto"),
        "runtime": sim_in_docker(REPO),
        # every "node" is this machine with host networking: pool 1 listens 100 ports higher
        "engine": {
            "python": "python3",
            "port": free_port(),
            "dist_init_port": free_port(),
            "ready_timeout_s": 120,
            "sim": {"time_scale": 0.002, "startup_s": 5},
        },
        "server": {"tp_size": 16, "ep_size": 16},
        "telemetry": {"gpu_interval_ms": 200},
        **two_configs_one_cell(),
        "repeats": 2,
    }
    cfg = experiment_file(tmp_path, changes)
    port = yaml.safe_load(cfg.read_text())["engine"]["port"]
    watch = LabelWatch(ssh, docker_node, run_id)
    watch.start()
    try:
        # up to results.csv: the pools run the cells; the analysis after it has no pool
        table = f"results/{run_id}/results.csv"
        proc = run_snakemake(tmp_path, "--cores", "2", table, "--configfile", str(cfg))
    finally:
        watch.done.set()
        watch.join()
    assert proc.returncode == 0, proc.stderr[-4000:]
    run_dir = tmp_path / "results" / run_id

    events = read_events(run_dir / "orchestrator.log")
    starts = {f["pool"]: (f["server"], f["nodes"]) for _, e, f in events if e == "start"}
    assert [e for _, e, _ in events].count("start") == 2
    assert {p: nodes for p, (_, nodes) in starts.items()} == {
        "0": "node1,node2",
        "1": "node3,node4",
    }
    assert node_overlaps(events) == []
    # Per pool: ports, container names, labels; the client on the pool's first node.
    pool1 = (run_dir / "service" / starts["1"][0] / "commands.sh").read_text()
    assert f"--port {port + 100}" in pool1 and "--dist-init-addr 127.0.0.4:" in pool1
    assert "--label servesweep.pool=1" in pool1 and "-r0-pool_1 " in pool1
    pool0 = (run_dir / "service" / starts["0"][0] / "commands.sh").read_text()
    assert f"--port {port} " in pool0 and "--label servesweep.pool=0" in pool0
    results = pd.read_csv(run_dir / "results.csv")
    assert sorted(results["pool"]) == [0, 0, 1, 1]
    # GPU snapshots of a pool-1 cell come from pool 1's nodes only
    gpu = pd.read_csv(next((run_dir / "gpu" / starts["1"][0]).rglob("r1.csv")))
    assert set(gpu[gpu["phase"] == "before"]["node"]) == {"node3", "node4"}
    # The labels on the nodes: both pools up at once at some moment, never two sets on a node
    assert watch.samples
    both = [s for s in watch.samples if {pool for _, pool, _ in s} == {"0", "1"}]
    assert both, "the two pools never ran at once"
    for sample in watch.samples:
        per_node = collections.defaultdict(set)
        for node, pool, fp in sample:
            per_node[node].add((pool, fp))
        assert all(len(sets) == 1 for sets in per_node.values()), sample
    left = ssh.run(docker_node, f"docker ps -aq --filter label=servesweep.run={run_id}", timeout=30)
    assert left.ok and left.stdout.strip() == ""
