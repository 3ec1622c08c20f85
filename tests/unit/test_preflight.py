"""Tests of servesweep.serving.preflight on this machine: ports, IB devices, P/D agreement."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml

from servesweep.cluster.access import open_cluster
from servesweep.config.load import load_experiment, load_experiment_file
from servesweep.config.matrix import server_specs
from servesweep.config.paths import RunPaths
from servesweep.core.errors import PreflightFailed
from servesweep.serving.preflight import listening_ports, pd_agreement, run_preflight
from servesweep.serving.servers import ServerManager
from tests.helpers import DEFAULT_CONFIG, REPO, deep_update, free_port


def _manager(tmp_path: Path, **changes) -> ServerManager:
    raw = deep_update(yaml.safe_load(DEFAULT_CONFIG.read_text()), changes)
    exp = load_experiment(raw, {})
    return ServerManager(exp, RunPaths(tmp_path / exp.run_id), cluster=open_cluster(exp))


def test_free_ports_pass_and_are_recorded(tmp_path: Path) -> None:
    m = _manager(tmp_path, engine={"port": free_port()})
    evidence = run_preflight(exp=m.exp, manager=m)
    assert {p["port"] for p in evidence["ports"]} == {m.exp.engine.port}
    assert evidence["image"] == [] and evidence["ib_devices"] == []


def test_port_in_use_is_refused_naming_node_and_port(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        m = _manager(tmp_path, engine={"port": port})
        with pytest.raises(PreflightFailed, match=f"node local: port {port} is already in use"):
            run_preflight(exp=m.exp, manager=m)


def test_missing_ib_device_is_refused(tmp_path: Path) -> None:
    m = _manager(
        tmp_path,
        engine={"port": free_port()},
        server={"disaggregation_ib_device": "mlx5_nonexistent"},
    )
    # The single-role default does not use IB; PD roles do (see the PD config below).
    assert run_preflight(exp=m.exp, manager=m)["ib_devices"] == []


def test_pd_config_ports_and_agreement() -> None:
    exp = load_experiment_file(REPO / "config" / "experiments" / "pd_standard.yaml")
    [spec] = server_specs(exp)
    assert pd_agreement(spec) == {"page_size": 64, "kv_cache_dtype": None}
    ports = listening_ports(exp, spec)
    assert ("601", 30000) in ports and ("601", 8998) in ports and ("605", 31000) in ports
    assert ("601", 20000) in ports and ("605", 20000) in ports
