"""doctor's network and RDMA checks on this machine (local transport): what a multi-NIC or PD
node needs before a start, shown per node; skipped where the node has none."""

from __future__ import annotations

from pathlib import Path

from servesweep.cluster.access import open_cluster
from servesweep.config.load import load_experiment_file
from servesweep.config.matrix import server_specs
from servesweep.config.paths import RunPaths
from servesweep.serving.engines import rank_commands
from servesweep.serving.servers import ServerManager
from servesweep.workflow import doctor
from tests.helpers import DEFAULT_CONFIG, REPO

PD_LOCAL = REPO / "config" / "experiments" / "pd_standard_local.yaml"


def _manager(exp, tmp_path: Path) -> ServerManager:
    return ServerManager(exp, RunPaths(tmp_path / exp.run_id), cluster=open_cluster(exp))


def test_network_lists_interfaces_and_checks_the_configured_one(tmp_path: Path) -> None:
    exp = load_experiment_file(DEFAULT_CONFIG)
    m = _manager(exp, tmp_path)
    plain = doctor.check_network(exp, m, "local")
    assert plain.status == "ok" and plain.detail.endswith("(socket_ifname unset)")
    up = next(line.split()[0] for line in plain.detail.split("; ") if line.split()[1:2] == ["up"])
    named = exp.model_copy(update={"cluster": exp.cluster.model_copy(update={"socket_ifname": up})})
    assert doctor.check_network(named, m, "local").status == "ok"
    absent = exp.model_copy(
        update={"cluster": exp.cluster.model_copy(update={"socket_ifname": "nosuch0"})}
    )
    check = doctor.check_network(absent, m, "local")
    assert check.status == "fail" and check.detail.startswith("socket_ifname nosuch0 is absent")
    # every rank's Gloo and NCCL bootstrap then use it
    [cmd] = rank_commands(named, server_specs(named)[0])
    assert cmd.env["GLOO_SOCKET_IFNAME"] == cmd.env["NCCL_SOCKET_IFNAME"] == up


def test_rdma_is_skipped_without_ib_and_fails_naming_what_a_real_pd_node_lacks(
    tmp_path: Path,
) -> None:
    exp = load_experiment_file(DEFAULT_CONFIG)
    assert doctor.check_rdma(exp, _manager(exp, tmp_path), "local").status == "skip"
    pd = load_experiment_file(PD_LOCAL)
    node = pd.cluster.nodes[0]
    assert doctor.check_rdma(pd, _manager(pd, tmp_path), node).status == "skip"  # simulated
    real = pd.model_copy(update={"engine": pd.engine.model_copy(update={"kind": "sglang"})})
    check = doctor.check_rdma(real, _manager(real, tmp_path), node)
    if Path("/sys/class/infiniband").exists():  # a machine with IB: only the shape is known
        assert check.status in ("ok", "fail")
    else:
        assert check.status == "fail" and check.detail.startswith("mlx5_0 ports none")
