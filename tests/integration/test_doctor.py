"""`servesweep doctor` over sshd + dockerd: one line per node and check, a missing model fails."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from servesweep.workflow.cli import main as cli
from tests.helpers import REPO
from tests.integration.nodes import free_port, sim_in_docker, ssh_cluster

pytestmark = pytest.mark.integration
CHECK_NAMES = (
    "model_path",
    "image",
    "gpus",
    "ib_devices",
    "network",
    "rdma",
    "ports",
    "clock",
    "disk",
)


def doctor_config(nodes_dir: Path, path: Path, model_path: str) -> Path:
    raw = {
        "run_id": "it-doctor",
        "cluster": ssh_cluster(nodes_dir, ["node1", "node2"]),
        "runtime": sim_in_docker(REPO),
        "engine": {"model_path": model_path, "port": free_port(), "dist_init_port": free_port()},
        "server": {"tp_size": 16, "ep_size": 16},
        "workload": {"input_len": 64, "output_len": 4, "num_requests": 2},
    }
    path.write_text(yaml.safe_dump(raw))
    return path


def test_doctor_lines_and_a_missing_model_path(
    nodes_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = doctor_config(nodes_dir, tmp_path / "ok.yaml", "/usr")
    args = ["doctor", "--configfile", str(cfg), "--results", str(tmp_path / "results")]
    assert cli(args) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    print(out)
    lines = out.splitlines()
    for node in ("node1", "node2"):
        names = [ln.split()[1] for ln in lines if ln.split()[0] == node]
        assert names == list(CHECK_NAMES)
    assert lines[-1].endswith("0 failed")
    bad = doctor_config(nodes_dir, tmp_path / "bad.yaml", "/no/such/model")
    assert cli(["doctor", "--configfile", str(bad), "--results", str(tmp_path / "results")]) == 1
    out = capsys.readouterr().out
    print(out)
    failed = [ln for ln in out.splitlines() if " fail " in ln]
    assert [ln.split()[:2] for ln in failed] == [["node1", "model_path"], ["node2", "model_path"]]
    assert "/no/such/model missing" in failed[0]
