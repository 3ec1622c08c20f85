"""Seed 003's PD suite over SSH + docker: P on node1-2, D on node3-4, router on node3."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pandas as pd
import pytest
import yaml

from servesweep.cluster.ssh import SshTransport
from servesweep.core.events import read_events
from tests.helpers import REPO, deep_update, free_port, run_snakemake
from tests.integration.nodes import NODES, sim_in_docker, ssh_cluster

pytestmark = pytest.mark.integration


def test_pd_standard_suite_over_ssh_and_docker(
    tmp_path: Path, nodes_dir: Path, docker_node: str, ssh: SshTransport
) -> None:
    run_id = f"it-pd-{uuid.uuid4().hex[:6]}"  # its own: leftovers are its own
    local = yaml.safe_load((REPO / "config/experiments/pd_standard_local.yaml").read_text())
    prefill, decode = list(NODES[:2]), list(NODES[2:])
    changes = {
        "run_id": run_id,
        "suite": "standard",
        "cluster": ssh_cluster(nodes_dir, NODES, gpus_per_node=16),
        "runtime": sim_in_docker(REPO),
        "engine": {"python": "python3", "sim": {"time_scale": 0.01, "startup_s": 20}},
        "roles": {
            # every "node" is this machine with host networking: each listener its own port
            "prefill": {
                "nodes": prefill,
                "port": free_port(),
                "dist_init_port": free_port(),
                "server": {"disaggregation_bootstrap_port": free_port()},
            },
            "decode": {"nodes": decode, "port": free_port(), "dist_init_port": free_port()},
        },
        "router": {"node": decode[0], "port": free_port()},
    }
    cfg = tmp_path / "pd.yaml"
    cfg.write_text(yaml.safe_dump(deep_update(local, changes)))
    # up to what this checks (summary.json's log scan, the case table): plots and report of a
    # PD run are test_pd_suite's
    run_dir = tmp_path / "results" / run_id
    targets = [str((run_dir / name).relative_to(tmp_path)) for name in ("summary.json", "cases.md")]
    proc = run_snakemake(tmp_path, "--cores", "1", *targets, "--configfile", str(cfg))
    assert proc.returncode == 0, proc.stderr[-4000:]

    assert len(list(run_dir.glob("raw/pd/case~*/r1.jsonl"))) == 4
    roles = [
        f["role"] for _, e, f in read_events(run_dir / "orchestrator.log") if e == "role-ready"
    ]
    assert roles == ["prefill", "decode", "router"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["log_scan"]["fatal_findings"] == 0
    assert summary["log_scan"]["evidence"]["p_state_slice_transfer"] > 0
    assert summary["log_scan"]["evidence"]["d_rdma_ready_ack"] > 0
    # every cell met its per-cell minimums (read over ssh from the containers' logs), in
    # config order, with its own seed and a flushed radix cache
    results = pd.read_csv(run_dir / "results.csv")
    required = [c for c in results.columns if c.startswith("evidence_")]
    assert len(required) == 3 and (results[required] > 0).all().all()
    assert list(results["client_id"]) == [
        "case~64-8-c1",
        "case~1k-16-c1-nonstream",
        "case~16k-1-c1",
        "case~16k-1-c8",
    ]
    assert results["seed"].is_unique and results["cache_flushed"].all()
    assert summary["warmup"][0]["requests"] == 1
    assert len(list((run_dir / "service" / "pd").glob("*-node*.log"))) == 5
    assert "| 16K -> 1, C8 | 40 |" in (run_dir / "cases.md").read_text()
    left = ssh.run(docker_node, f"docker ps -aq --filter label=servesweep.run={run_id}", timeout=30)
    assert left.ok and left.stdout.strip() == ""
