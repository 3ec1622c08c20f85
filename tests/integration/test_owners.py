"""Owners on a shared docker node over SSH: same RUN_ID from two checkouts, conflicts, --force."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from servesweep.cluster.access import Cluster
from servesweep.cluster.runtime import DockerRuntime
from servesweep.cluster.ssh import SshTransport
from servesweep.config.load import load_experiment
from servesweep.config.matrix import server_specs
from servesweep.config.paths import RunPaths
from servesweep.core.errors import ServerConflict
from servesweep.serving.servers import ServerManager
from tests.helpers import REPO
from tests.integration.nodes import ADDRESSES, free_port, sim_in_docker

pytestmark = pytest.mark.integration


def _manager(ssh: SshTransport, root: Path, run_id: str, port: int) -> ServerManager:
    exp = load_experiment(
        {
            "run_id": run_id,
            "cluster": {
                "transport": "ssh",
                "nodes": ["node1"],
                "addresses": {"node1": ADDRESSES["node1"]},
            },
            "runtime": sim_in_docker(REPO),
            "engine": {
                "model_path": "sim/owners",
                "port": port,
                "dist_init_port": free_port(),
                "ready_timeout_s": 120,
                "sim": {"time_scale": 0.001, "startup_s": 1},
            },
            "server": {"tp_size": 8, "ep_size": 8},
            "workload": {"input_len": 64, "output_len": 4, "num_requests": 2},
        }
    )
    runtime = DockerRuntime(ssh, exp.runtime, sudo_password=None, gpus=None)
    cluster = Cluster(ssh, runtime, local=False, containers=True)
    return ServerManager(exp, RunPaths(root / "results" / run_id), cluster=cluster)


def test_two_owners_share_a_docker_node(ssh: SshTransport, tmp_path: Path) -> None:
    run_id = f"it-owners-{uuid.uuid4().hex[:6]}"
    ours = _manager(ssh, tmp_path / "clone-a", run_id, free_port())
    theirs = _manager(ssh, tmp_path / "clone-b", run_id, free_port())
    clash = _manager(ssh, tmp_path / "clone-c", run_id, ours.exp.engine.port)
    spec = server_specs(ours.exp)[0]
    try:
        mine, _ = ours.ensure(spec)
        other, fresh = theirs.ensure(server_specs(theirs.exp)[0])
        assert fresh and other.ranks[0].handle != mine.ranks[0].handle
        names = ssh.run("node1", "docker ps --format '{{.Names}}'", timeout=60).stdout
        assert ours.owner.tag in names and theirs.owner.tag in names
        theirs.paths.current_server.unlink()  # as after a SIGKILL: their stale search by label
        theirs.stop_all(reason="their down")
        assert ours.runtime.is_running("node1", mine.ranks[0].handle)
        assert not theirs.runtime.is_running("node1", other.ranks[0].handle)
        with pytest.raises(ServerConflict, match=ours.owner.label.replace(".", r"\.")):
            clash.ensure(server_specs(clash.exp)[0])
        assert ours.runtime.is_running("node1", mine.ranks[0].handle)
        removed = clash.remove_foreign(server_specs(clash.exp))
        assert [r.handle for r in removed] == [mine.ranks[0].handle]
        assert not ours.runtime.is_running("node1", mine.ranks[0].handle)
    finally:
        for m in (ours, theirs, clash):
            m.stop_all(reason="test teardown")


def test_a_service_in_docker_outlives_runs_and_status_reads_labels(
    ssh: SshTransport, tmp_path: Path
) -> None:
    port = free_port()
    up = _manager(ssh, tmp_path, f"it-up-{uuid.uuid4().hex[:6]}", port)
    up.service_mode = True
    spec = server_specs(up.exp)[0]
    run = _manager(ssh, tmp_path, f"it-run-{uuid.uuid4().hex[:6]}", port)
    try:
        service, fresh = up.ensure(spec)
        assert fresh
        state, fresh = run.ensure(server_specs(run.exp)[0])
        assert not fresh and state.ranks[0].handle == service.ranks[0].handle
        run.stop_all(reason="workflow finished")
        assert run.runtime.is_running("node1", service.ranks[0].handle)
        [row] = [r for r in run.status() if r["mine"] == "true"]
        assert row["service"] == spec.fingerprint and row["running"] == "True"
        assert row["used_by"] == f"{up.exp.run_id},{run.exp.run_id}"
        run.stop_all(reason="servesweep down", services=True)
        assert not run.runtime.is_running("node1", service.ranks[0].handle)
    finally:
        up.stop_all(reason="test teardown", services=True)
