"""Nodes that are slices of one host (`cluster.gpu_ids`): prefill and decode on one machine's
GPUs. Each rank sees only its node's GPUs; preflight and telemetry count only those."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from servesweep.cluster import telemetry
from servesweep.cluster.access import open_cluster
from servesweep.config.load import load_experiment
from servesweep.config.matrix import server_specs
from servesweep.config.paths import RunPaths
from servesweep.core.errors import ConfigError, PreflightFailed
from servesweep.serving.engines import rank_commands
from servesweep.serving.preflight import gpus_idle
from servesweep.serving.servers import ServerManager
from servesweep.sim.smi import GPU_MARK_ENV
from tests.helpers import REPO, deep_update, free_port

PD_LOCAL = REPO / "config" / "experiments" / "pd_standard_local.yaml"


def one_host_pd(**changes) -> dict:
    """Seed 003's PD shape on one 4-GPU host: prefill on GPUs 0-1, decode on 2-3."""
    raw = yaml.safe_load(PD_LOCAL.read_text())
    raw["cluster"] = {
        "transport": "local",
        "nodes": ["p01", "d23"],
        "gpus_per_node": 2,
        "gpu_ids": {"p01": [0, 1], "d23": [2, 3]},
    }
    raw["roles"]["prefill"] |= {"nodes": ["p01"], "port": free_port()}
    raw["roles"]["prefill"]["server"] |= {"pp_size": 1, "tp_size": 2, "ep_size": 2}
    raw["roles"]["decode"] |= {"nodes": ["d23"], "port": free_port()}
    raw["roles"]["decode"]["server"] |= {"tp_size": 2, "ep_size": 2}
    raw["router"] |= {"node": "d23", "port": free_port()}
    return deep_update(raw, changes)


def test_each_rank_sees_only_its_nodes_gpus() -> None:
    exp = load_experiment(one_host_pd(), {})
    commands = rank_commands(exp, server_specs(exp)[0])
    env = {c.role: (c.node, c.env.get("CUDA_VISIBLE_DEVICES")) for c in commands}
    assert env == {"prefill": ("p01", "0,1"), "decode": ("d23", "2,3"), "router": ("d23", None)}


@pytest.mark.parametrize(
    ("gpu_ids", "message"),
    [
        (
            {"p01": [0, 1], "d99": [2, 3]},
            "'cluster.gpu_ids': given for nodes not in cluster.nodes: ['d99']",
        ),
        ({"p01": [0], "d23": [2, 3]}, "'cluster.gpu_ids.p01': [0] must be 2 distinct GPU indices"),
        (
            {"p01": [0, 1], "d23": [1, 2]},
            "'cluster.gpu_ids.d23': GPU 1 is also node p01's on one host",
        ),
    ],
)
def test_a_bad_slice_is_one_line_naming_it(gpu_ids: dict, message: str) -> None:
    raw = one_host_pd()
    raw["cluster"]["gpu_ids"] = gpu_ids
    with pytest.raises(ConfigError) as info:
        load_experiment(raw, {})
    assert message in str(info.value) and "\n" not in str(info.value)


def test_nodes_on_different_hosts_may_use_the_same_indices() -> None:
    raw = one_host_pd()
    raw["cluster"] |= {"transport": "ssh", "addresses": {"p01": "10.0.0.1", "d23": "10.0.0.2"}}
    raw["cluster"]["gpu_ids"] = {"p01": [0, 1], "d23": [0, 1]}
    raw["engine"]["port"] = 30000
    for role in ("prefill", "decode"):
        raw["roles"][role]["port"] = 30000 + (role == "decode")
    raw["router"]["port"] = 31000
    assert load_experiment(raw, {}).cluster.visible_gpus("d23") == [0, 1]


def test_preflight_counts_only_the_nodes_gpus(tmp_path: Path) -> None:
    """The sim's host shows 4 GPUs; a foreign process on GPU 1 of node d23's host is outside
    d23's slice (2-3): idle; on GPU 3 it is inside: preflight names it."""
    exp = load_experiment(one_host_pd(), {})
    m = ServerManager(exp, RunPaths(tmp_path / exp.run_id), cluster=open_cluster(exp))
    assert [g["gpus"] for g in gpus_idle(exp=exp, manager=m)] == [2, 2]
    for index, busy in ((1, False), (3, True)):
        env = {**os.environ, GPU_MARK_ENV: f"{m.owner.checkout}:d23:{index}"}
        foreign = subprocess.Popen(["sleep", "60"], env=env)
        try:
            if busy:
                with pytest.raises(
                    PreflightFailed, match=f"node d23: GPU 3 busy: pid {foreign.pid}"
                ):
                    gpus_idle(exp=exp, manager=m)
            else:
                assert all(g["idle"] for g in gpus_idle(exp=exp, manager=m))
        finally:
            foreign.kill()
            foreign.wait()


def test_telemetry_keeps_only_the_nodes_gpus() -> None:
    rows = [
        {"node": n, "index": float(i), "power_draw_w": 100.0 + i}
        for n in ("p01", "d23")
        for i in range(4)
    ]
    rows.append({"node": "d23", "index": None, "status": "unavailable"})
    kept = telemetry.visible_rows(rows, {"p01": [0, 1], "d23": [2, 3]})
    assert [(r["node"], r["index"]) for r in kept] == [
        ("p01", 0.0),
        ("p01", 1.0),
        ("d23", 2.0),
        ("d23", 3.0),
        ("d23", None),
    ]
    assert telemetry.visible_rows(rows, {"p01": None, "d23": None}) == rows


def test_another_slice_is_another_server_and_no_slice_keeps_old_fingerprints() -> None:
    sliced = load_experiment(one_host_pd(), {})
    moved = one_host_pd()
    moved["cluster"]["gpu_ids"] = {"p01": [2, 3], "d23": [0, 1]}
    whole = one_host_pd()
    del whole["cluster"]["gpu_ids"]
    prints = [
        server_specs(load_experiment(raw, {}))[0].fingerprint
        for raw in (one_host_pd(), moved, whole)
    ]
    assert prints[0] == server_specs(sliced)[0].fingerprint
    assert len(set(prints)) == 3
