"""Nodes that are slices of one host (`cluster.gpu_ids`): prefill and decode on one machine's
GPUs, or on the same GPU (PD on one GPU). Each rank sees only its node's GPUs; preflight and
telemetry count only those, a shared GPU once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from servesweep.analysis import gpufigures
from servesweep.cluster import gpuidle, gpusampling, telemetry
from servesweep.cluster.access import open_cluster
from servesweep.cluster.transport import CommandResult
from servesweep.config.experiment import gpu_shared_by, start_waves
from servesweep.config.load import load_experiment
from servesweep.config.matrix import cell_repeats, server_specs
from servesweep.config.paths import RunPaths
from servesweep.core import gpufile
from servesweep.core.errors import ConfigError, PreflightFailed
from servesweep.measure import cells
from servesweep.serving.engines import rank_commands
from servesweep.serving.preflight import gpus_idle
from servesweep.serving.servers import ServerManager
from servesweep.serving.state import RankState, ServerState
from servesweep.sim.smi import GPU_MARK_ENV
from tests.helpers import DEFAULT_CONFIG, REPO, deep_update, free_port
from tests.support.runs import DATA

# What preflight's probe printed on the H200 while a service of SGLang 0.5.17 held the GPU
SERVICE_UP_PROBE = DATA / "nvidia-smi" / "probe-sglang-service-up.txt"

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


# ------------------------------------------------ PD on one GPU: prefill and decode share it

REAL_SMI = DATA / "nvidia-smi"
SERIES = DATA / "nvidia-smi-series" / "loop-500ms-idle-load-idle.csv"


def one_gpu_pd(**changes) -> dict:
    """Seed 003's PD shape on one GPU: prefill (p0) and decode (d0) share GPU 0 of the host,
    each with a memory share (h200_pd_rehearsal.yaml's shape)."""
    raw = one_host_pd()
    raw["cluster"] |= {"nodes": ["p0", "d0"], "gpus_per_node": 1, "gpu_ids": {"p0": [0], "d0": [0]}}
    for role, node in (("prefill", "p0"), ("decode", "d0")):
        raw["roles"][role]["nodes"] = [node]
        raw["roles"][role]["server"] |= {"tp_size": 1, "ep_size": 1, "mem_fraction_static": 0.3}
    raw["router"]["node"] = "d0"
    return deep_update(raw, changes)


def test_prefill_and_decode_may_share_one_gpu_with_their_memory_shares() -> None:
    exp = load_experiment(one_gpu_pd(), {})
    commands = rank_commands(exp, server_specs(exp)[0])
    env = {c.role: (c.node, c.env.get("CUDA_VISIBLE_DEVICES")) for c in commands}
    assert env == {"prefill": ("p0", "0"), "decode": ("d0", "0"), "router": ("d0", None)}
    assert all("--mem-fraction-static 0.3" in " ".join(c.argv) for c in commands[:2])
    assert exp.cluster.shared_gpus() == {("", 0): ["p0", "d0"]}
    # read once, under its first node: p0 keeps GPU 0's rows, d0 has none of its own
    assert {n: exp.cluster.telemetry_gpus(n) for n in exp.cluster.nodes} == {"p0": [0], "d0": []}
    assert cells.gpu_nodes(exp) == ["p0"]
    roles = [(r.name, r.nodes) for r in server_specs(exp)[0].roles]
    assert gpu_shared_by(exp.cluster, roles) == "prefill+decode"
    sliced = load_experiment(one_host_pd(), {})
    assert (
        gpu_shared_by(sliced.cluster, [(r.name, r.nodes) for r in server_specs(sliced)[0].roles])
        == ""
    )
    assert cells.gpu_nodes(sliced) == ["p01", "d23"]


def test_engines_on_one_gpu_start_in_turn_on_disjoint_gpus_together() -> None:
    """Two processes profiling one GPU's free memory at once would race; on disjoint GPUs the
    engines start together, the router after both (docs/pools.md)."""
    for raw, waves in (
        (one_gpu_pd(), [("prefill",), ("decode",), ("router",)]),
        (one_host_pd(), [("prefill", "decode"), ("router",)]),
    ):
        exp = load_experiment(raw, {})
        roles = [(r.name, r.nodes) for r in server_specs(exp)[0].roles]
        assert start_waves(exp.cluster, roles, router="router") == waves
    single = load_experiment(yaml.safe_load(DEFAULT_CONFIG.read_text()), {})
    roles = [(r.name, r.nodes) for r in server_specs(single)[0].roles]
    assert start_waves(single.cluster, roles, router=None) == [("server",)]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (  # SGLang's default would take ~0.9 of the GPU in each process
            {"roles": {"prefill": {"server": {"mem_fraction_static": None}}}},
            "'roles.prefill.server.mem_fraction_static': unset for prefill, but prefill and "
            "decode share GPU 0 of one host (cluster.gpu_ids: p0, d0)",
        ),
        (
            {
                "roles": {
                    "prefill": {"server": {"mem_fraction_static": None}},
                    "decode": {"server": {"mem_fraction_static": None}},
                }
            },
            "'server.mem_fraction_static': unset for prefill and decode, but prefill and decode "
            "share GPU 0",
        ),
        (
            {"roles": {"decode": {"server": {"mem_fraction_static": 0.7}}}},
            "'roles.decode.server.mem_fraction_static': prefill 0.3 "
            "(roles.prefill.server.mem_fraction_static) + decode 0.7 "
            "(roles.decode.server.mem_fraction_static) = 1 is more than 0.95 of GPU 0",
        ),
        (  # a matrix axis: each server config's shares
            {
                "matrix": {"server": {"mem_fraction_static": [0.3, 0.5]}},
                "roles": {
                    "prefill": {"server": {"mem_fraction_static": None}},
                    "decode": {"server": {"mem_fraction_static": None}},
                },
            },
            "'matrix.server.mem_fraction_static': prefill 0.5 (matrix.server.mem_fraction_static)"
            " + decode 0.5 (matrix.server.mem_fraction_static) = 1 is more than 0.95 of GPU 0 of "
            "one host (cluster.gpu_ids: p0, d0) that both roles' processes share (with "
            "{'mem_fraction_static': 0.5})",
        ),
    ],
)
def test_sharing_a_gpu_needs_both_memory_shares_at_most_095(changes: dict, message: str) -> None:
    raw = one_gpu_pd(**changes)
    for role in raw["roles"].values():  # None: leave the key out (the shared server's is unset)
        role["server"] = {k: v for k, v in role["server"].items() if v is not None}
    with pytest.raises(ConfigError) as info:
        load_experiment(raw, {})
    assert message in str(info.value) and "\n" not in str(info.value)


def test_shares_summing_to_095_pass_and_the_shared_server_section_counts() -> None:
    raw = one_gpu_pd(server={"mem_fraction_static": 0.45})
    for role in raw["roles"].values():
        del role["server"]["mem_fraction_static"]
    load_experiment(raw, {})
    load_experiment(one_gpu_pd(roles={"decode": {"server": {"mem_fraction_static": 0.65}}}), {})


def two_decode_nodes(gpu_ids: dict) -> dict:
    """Prefill on p0, decode over d0 and d1 (TP 2), one GPU a node."""
    raw = one_gpu_pd()
    raw["cluster"] |= {"nodes": ["p0", "d0", "d1"], "gpu_ids": gpu_ids}
    raw["roles"]["decode"]["nodes"] = ["d0", "d1"]
    raw["roles"]["decode"]["server"] |= {"tp_size": 2, "ep_size": 2}
    return raw


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (  # two nodes of one role
            two_decode_nodes({"p0": [1], "d0": [0], "d1": [0]}),
            "'cluster.gpu_ids.d1': GPU 0 is also node d0's on one host; only the prefill and the "
            "decode node of one PD server set may share GPUs",
        ),
        (  # three nodes on one GPU
            two_decode_nodes({"p0": [0], "d0": [0], "d1": [0]}),
            "'cluster.gpu_ids.d1': GPU 0 is also node p0's on one host, and node d0's; at most "
            "a PD set's prefill and decode node share a GPU",
        ),
        (  # a node without an entry has GPUs 0..gpus_per_node-1 of the sliced host
            deep_update(
                one_host_pd(),
                {
                    "cluster": {
                        "nodes": ["p01", "d23", "r"],
                        "gpu_ids": {"p01": [0, 1], "d23": [2, 3]},
                    },
                    "router": {"node": "r"},
                },
            ),
            "'cluster.gpu_ids.r': GPU 0 is also node p01's on one host (node r has no gpu_ids "
            "entry: GPUs 0-1 of its host); only the prefill and the decode node",
        ),
    ],
)
def test_other_overlaps_stay_refused(raw: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_experiment(raw, {})
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_node_without_gpu_ids_on_a_sliced_host_is_its_implicit_gpus() -> None:
    """One server over two nodes of one host: `a` has GPU 0, `b` has no entry (GPU 0 too):
    refused, where the old check passed it; with `a` on GPU 1, `b` reads only GPU 0."""
    raw = yaml.safe_load(DEFAULT_CONFIG.read_text())
    raw["cluster"] = {"transport": "local", "nodes": ["a", "b"], "gpus_per_node": 1}
    raw["server"] |= {"tp_size": 2, "ep_size": 2}
    with pytest.raises(ConfigError, match="'cluster.gpu_ids.b': GPU 0 is also node a's on one "):
        load_experiment(deep_update(raw, {"cluster": {"gpu_ids": {"a": [0]}}}), {})
    exp = load_experiment(deep_update(raw, {"cluster": {"gpu_ids": {"a": [1]}}}), {})
    assert {n: exp.cluster.telemetry_gpus(n) for n in ("a", "b")} == {"a": [1], "b": [0]}
    # no gpu_ids at all: every local node is a host of its own (the sim's nodes), as before
    exp = load_experiment(raw, {})
    assert exp.cluster.shared_gpus() == {} and exp.cluster.telemetry_gpus("b") is None


def _smi_rows(node: str, phase: str, capture: str) -> list[dict]:
    """A real nvidia-smi snapshot (one H200) as node `node` reports it."""
    text = (REAL_SMI / capture).read_text()
    return telemetry.node_rows(CommandResult(node, "", 0, text, ""), phase=phase)


def _samples(node: str) -> list[dict]:
    """The recorded H200 loop series as node `node`'s samples."""
    meta = {"node": node, "phase": gpufile.PHASE_SAMPLE, "status": "ok", "detail": ""}
    return [{**meta, **r} for r in telemetry.parse_with_header(SERIES.read_text())]


def test_a_shared_gpu_is_one_gpu_in_the_cells_file_and_figures() -> None:
    """Both nodes' nvidia-smi show the one real H200 (what pd1gpu.yaml, two node names on one
    GPU, recorded on 2026-12-07: gpu_count 2, energy twice). The cell keeps it once."""
    exp = load_experiment(one_gpu_pd(), {})
    window = gpusampling.window_rows(
        gpufile.parse_timestamp("2026/12/01 14:13:40.000"),
        gpufile.parse_timestamp("2026/12/01 14:13:58.000"),
    )
    both = [
        *(
            r
            for n in ("p0", "d0")
            for r in _smi_rows(n, "before", "query-idle-noheader-nounits.csv")
        ),
        *window,
        *_samples("p0"),
        *_samples("d0"),
        *(
            r
            for n in ("p0", "d0")
            for r in _smi_rows(n, "after", "query-idle-noheader-nounits.csv")
        ),
    ]
    twice = gpufigures.gpu_figures(both)
    assert twice["gpu_count"] == 2  # the double count of the two-node-names run
    kept = telemetry.visible_rows(
        both, {n: exp.cluster.telemetry_gpus(n) for n in exp.cluster.nodes}
    )
    assert {r["node"] for r in kept if r.get("node")} == {"p0"}
    roles = [(r.name, r.nodes) for r in server_specs(exp)[0].roles]
    once = gpufigures.gpu_figures(kept, shared_by=gpu_shared_by(exp.cluster, roles))
    alone = gpufigures.sample_figures([*window, *_samples("p0")])
    assert once["gpu_count"] == 1 and once["gpu_status"] == "ok"
    assert once["gpu_energy_j"] == pytest.approx(alone["gpu_energy_j"])
    assert twice["gpu_energy_j"] == pytest.approx(2 * once["gpu_energy_j"])
    assert once["gpu_power_mean_w"] == pytest.approx(twice["gpu_power_mean_w"] / 2)
    assert once["gpu_power_peak_w"] == pytest.approx(twice["gpu_power_peak_w"] / 2)
    assert once["gpu_util_mean_pct"] == pytest.approx(twice["gpu_util_mean_pct"])
    assert once["gpu_samples"] == twice["gpu_samples"] / 2
    assert once["gpu_node_power_w"].startswith("p0=") and "d0" not in once["gpu_node_power_w"]
    assert once["gpu_shared_by"] == "prefill+decode"


def test_the_sims_shared_gpu_is_one_row_set_following_both_roles(tmp_path: Path) -> None:
    exp = load_experiment(one_gpu_pd(engine={"kind": "sim"}), {})
    manager = ServerManager(exp, RunPaths(tmp_path / exp.run_id), cluster=open_cluster(exp))
    cell = cell_repeats(exp)[0]
    urls = {"prefill": "http://127.0.0.1:1", "decode": "http://127.0.0.1:2"}
    state = ServerState(
        fingerprint=cell.server.fingerprint,
        server_id=cell.server.id,
        base_url="http://127.0.0.1:3",
        ranks=[
            RankState("prefill", "p0", 0, "999999999", "log", urls["prefill"]),
            RankState("decode", "d0", 0, "999999999", "log", urls["decode"]),
            RankState("router", "d0", 0, "999999999", "log", "http://127.0.0.1:3"),
        ],
    )
    sampler = cells.gpu_sampler(exp=exp, manager=manager, state=state, cell=cell)
    assert isinstance(sampler, gpusampling.SimulatedSampler)
    assert sampler.loads == {"p0": (urls["prefill"], urls["decode"])}
    held = {urls["prefill"]: 0.0, urls["decode"]: 1.0}  # only decode holds a request
    sampler._held = held.__getitem__  # type: ignore[method-assign]
    sampler.sample()
    sampler.sample()
    assert [(r["node"], r["index"]) for r in sampler.rows] == [("p0", 0.0), ("p0", 0.0)]
    loaded = gpusampling.SIM_IDLE_W + (gpusampling.SIM_LOADED_W - gpusampling.SIM_IDLE_W) * 0.5
    assert sampler.rows[0]["power_draw_w"] == pytest.approx(loaded)  # decode's load counts


def test_preflight_takes_a_reused_pd_set_on_a_shared_gpu_as_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed 003's flow on one GPU: `servesweep up` left prefill (p0) and decode (d0) on GPU 0,
    so each node's probe lists both processes. Both are ours: p0's probe must not call the
    decode process foreign (today's check took only the node's own ranks)."""
    sessions = [
        subprocess.Popen(
            ["setsid", "sh", "-c", "sleep 60 & echo $! && wait"], stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    try:
        children = [s.stdout.readline().strip() for s in sessions]
        # the real probe of SGLang 0.5.17 holding the H200, with a second scheduler on it
        gpu, apps = gpuidle.split_probe(SERVICE_UP_PROBE.read_text().replace("1229", children[0]))
        apps += f"00000000:00:06.0, {children[1]}, sglang::scheduler, 40000 MiB\n"
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (tmp_path / "gpu.csv").write_text(gpu)
        (tmp_path / "apps.csv").write_text(apps)
        smi = bin_dir / "nvidia-smi"
        smi.write_text(
            f'#!/bin/sh\ncase "$*" in *compute-apps*) cat {tmp_path}/apps.csv;; '
            f"*) cat {tmp_path}/gpu.csv;; esac\n"
        )
        smi.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
        exp = load_experiment(one_gpu_pd(engine={"kind": "sglang", "version": "0.5.17"}), {})
        m = ServerManager(exp, RunPaths(tmp_path / exp.run_id), cluster=open_cluster(exp))
        [spec] = server_specs(exp)
        state = ServerState(
            fingerprint=spec.fingerprint,
            server_id=spec.id,
            base_url="http://127.0.0.1:1",
            ranks=[
                RankState("prefill", "p0", 0, str(sessions[0].pid), "log"),
                RankState("decode", "d0", 0, str(sessions[1].pid), "log"),
            ],
            service=True,
            run_id="pd-up",
        )
        m.paths.service_record(spec.fingerprint).parent.mkdir(parents=True, exist_ok=True)
        m.paths.service_record(spec.fingerprint).write_text(json.dumps(state.to_dict()))
        found = gpus_idle(exp=exp, manager=m)
        ours = f"server {spec.id} (service {spec.fingerprint})"
        assert [(g["node"], g["gpus"], g["held_by_ours"]) for g in found] == [
            ("p0", 1, {"0": ours}),
            ("d0", 1, {"0": ours}),
        ]
        m.paths.service_record(spec.fingerprint).unlink()  # no service: both are foreign
        with pytest.raises(PreflightFailed, match=f"node p0: GPU 0 busy: pid {children[0]} "):
            gpus_idle(exp=exp, manager=m)
    finally:
        for s in sessions:
            os.killpg(s.pid, signal.SIGKILL)
            s.wait()


def test_a_node_without_gpu_ids_on_a_sliced_host_sees_only_its_implicit_gpus(
    tmp_path: Path,
) -> None:
    """Node `b` has no entry, `a` has GPU 1 of one host: the check counts `b` as GPU 0, so
    its ranks see only GPU 0 (they saw every GPU of the host, `a`'s too)."""
    raw = yaml.safe_load(DEFAULT_CONFIG.read_text())
    raw["cluster"] = {"transport": "local", "nodes": ["a", "b"], "gpus_per_node": 1}
    raw["server"] |= {"tp_size": 2, "ep_size": 2}
    exp = load_experiment(deep_update(raw, {"cluster": {"gpu_ids": {"a": [1]}}}), {})
    env = {
        c.node: c.env.get("CUDA_VISIBLE_DEVICES") for c in rank_commands(exp, server_specs(exp)[0])
    }
    assert env == {"a": "1", "b": "0"}
    assert {n: exp.cluster.visible_gpus(n) for n in ("a", "b")} == {"a": [1], "b": [0]}
    # a host nobody slices: every GPU it shows, no CUDA_VISIBLE_DEVICES (as before)
    plain = load_experiment(raw, {})
    assert plain.cluster.visible_gpus("b") is None
    assert all(
        "CUDA_VISIBLE_DEVICES" not in c.env for c in rank_commands(plain, server_specs(plain)[0])
    )
