"""`servesweep doctor` over sshd + dockerd: one line per node and check, a missing model fails."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
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


def _listener(answer: bytes | None) -> socket.socket:
    """A loopback listener that is no sshd: it closes each connection after `answer`, or
    (None) never answers."""
    server = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            if answer is None:
                held.append(conn)
            else:
                conn.sendall(answer)
                conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return server


def test_doctor_on_unreachable_nodes_one_line_each_with_the_reason(tmp_path: Path) -> None:
    """Nodes no SSH session reaches (a loopback port nothing listens on, a port that answers
    HTTP, a port that never answers): one line per node naming it and the reason, a next step
    that is not doctor itself, and no traceback."""
    http, silent = _listener(b"HTTP/1.0 400 Bad Request\r\n\r\n"), _listener(None)
    ports = {
        "refused": free_port(),
        "http": http.getsockname()[1],
        "silent": silent.getsockname()[1],
    }
    config = tmp_path / "ssh_config"
    config.write_text(
        "".join(
            f"Host {n}\n  HostName 127.0.0.1\n  Port {p}\n  User root\n  BatchMode yes\n"
            for n, p in ports.items()
        )
    )
    raw = {
        "run_id": "it-doctor-unreachable",
        "cluster": {
            "transport": "ssh",
            "nodes": list(ports),
            "addresses": dict.fromkeys(ports, "127.0.0.1"),
            "ssh": {"config_file": str(config), "connect_timeout_s": 3},
        },
        "runtime": {"kind": "process"},
        "engine": {"model_path": "/usr", "port": free_port(), "dist_init_port": free_port()},
        "server": {"tp_size": 24, "ep_size": 24},
        "workload": {"input_len": 64, "output_len": 4, "num_requests": 2},
    }
    cfg = tmp_path / "doctor.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "servesweep.workflow.cli", "doctor", "--configfile", str(cfg)]
            + ["--results", str(tmp_path / "results")],
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        http.close()
        silent.close()
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stdout + proc.stderr
    assert proc.stderr.strip() == ""
    lines = {ln.split()[0]: ln for ln in proc.stdout.splitlines() if " reach " in ln}
    assert set(lines) == set(ports)
    assert len(proc.stdout.splitlines()) == len(ports) + 2  # + the workflow's disk, the count
    assert f"connection refused on port {ports['refused']}" in lines["refused"]
    assert "not as an SSH server" in lines["http"]
    assert "timeout" in lines["silent"]
    for node, line in lines.items():
        assert "servesweep doctor" not in line
        assert f"`ssh -F {config} {node} true`" in line
