"""Tests of servesweep.serving.preflight on this machine: ports, IB devices, P/D agreement."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from servesweep.cluster import gpuidle
from servesweep.cluster.access import open_cluster
from servesweep.config.load import load_experiment, load_experiment_file
from servesweep.config.matrix import server_specs
from servesweep.config.paths import RunPaths
from servesweep.core.errors import PreflightFailed
from servesweep.serving.preflight import (
    engine_versions,
    gpus_idle,
    listening_ports,
    model_on_node,
    model_present,
    pd_agreement,
    rdma_problems,
    run_preflight,
)
from servesweep.serving.servers import ServerManager
from servesweep.serving.state import RankState, ServerState
from servesweep.sim.smi import GPU_MARK_ENV
from tests.helpers import DEFAULT_CONFIG, REPO, deep_update, free_port
from tests.support.runs import DATA


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


# What preflight's probe printed on the H200 while a `servesweep up` service of SGLang 0.5.17
# held the GPU (pid 1229: its scheduler subprocess, in the launcher's session).
SERVICE_UP_PROBE = DATA / "nvidia-smi" / "probe-sglang-service-up.txt"
REAL_GPU_PID = "1229"


def test_the_real_probe_of_our_service_passes_only_when_the_pid_is_ours() -> None:
    states = gpuidle.parse(*gpuidle.split_probe(SERVICE_UP_PROBE.read_text()))
    assert [(s.index, s.pids, s.used_mib) for s in states] == [("0", (1229,), 73530.0)]
    ours = {1229: "server chunked_prefill_size~8192 (service a54f494163ad)"}
    assert gpuidle.busy_reason("local", states, expected=1, max_used_mib=1024, ours=ours) is None
    reason = gpuidle.busy_reason("local", states, expected=1, max_used_mib=1024, ours={})
    assert reason == (
        "node local: GPU 0 busy: pid 1229 sglang::scheduler 73520 MiB; memory used 73530 MiB "
        "(limit 1024 MiB, preflight.gpu_idle_max_memory_mib)"
    )


def _real_engine_manager(tmp_path: Path, python: str) -> ServerManager:
    raw = yaml.safe_load((REPO / "config" / "experiments" / "h200_rehearsal.yaml").read_text())
    raw["engine"]["python"] = python
    exp = load_experiment(raw, {"RUN_ID": "flow-b", "CHUNKED_PREFILL_SIZES_CSV": "8192"})
    return ServerManager(exp, RunPaths(tmp_path / exp.run_id), cluster=open_cluster(exp))


def _fake(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


def test_seed_003_flow_a_gpu_held_by_our_service_passes_a_foreign_one_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The service: a process session whose child holds "the GPU" (as SGLang's scheduler
    # subprocess does); nvidia-smi replays the real probe with that child's pid.
    service = subprocess.Popen(
        ["setsid", "sh", "-c", "sleep 60 & echo $! && wait"], stdout=subprocess.PIPE, text=True
    )
    try:
        child = service.stdout.readline().strip()
        probe = SERVICE_UP_PROBE.read_text().replace(REAL_GPU_PID, child)
        gpu, apps = gpuidle.split_probe(probe)
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (tmp_path / "gpu.csv").write_text(gpu)
        (tmp_path / "apps.csv").write_text(apps)
        _fake(bin_dir, "nvidia-smi", f'case "$*" in *compute-apps*) cat {tmp_path}/apps.csv;;'
              f" *) cat {tmp_path}/gpu.csv;; esac\n")  # fmt: skip
        _fake(bin_dir, "fakepython", "echo 0.5.17\n")
        monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
        m = _real_engine_manager(tmp_path, str(bin_dir / "fakepython"))
        with pytest.raises(PreflightFailed, match=f"node local: GPU 0 busy: pid {child} "):
            gpus_idle(exp=m.exp, manager=m)  # no service of ours: someone else's process
        [spec] = server_specs(m.exp)
        state = ServerState(
            fingerprint=spec.fingerprint,
            server_id=spec.id,
            base_url="http://127.0.0.1:1",
            ranks=[RankState("server", "local", 0, str(service.pid), "log")],
            service=True,
            run_id="flow-a",
        )
        m.paths.service_record(spec.fingerprint).parent.mkdir(parents=True, exist_ok=True)
        m.paths.service_record(spec.fingerprint).write_text(json.dumps(state.to_dict()))
        [entry] = gpus_idle(exp=m.exp, manager=m)
        assert entry["held_by_ours"] == {"0": f"server {spec.id} (service {spec.fingerprint})"}
        assert engine_versions(exp=m.exp, manager=m) == {"local": "0.5.17"}
        _fake(bin_dir, "fakepython", "echo 0.5.23\n")
        with pytest.raises(PreflightFailed, match="sglang 0.5.23 is installed, engine.version"):
            engine_versions(exp=m.exp, manager=m)
    finally:
        os.killpg(service.pid, signal.SIGKILL)
        service.wait()


def test_a_model_missing_on_a_node_fails_before_any_start(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake(bin_dir, "fakepython", "echo 0.5.17\n")
    m = _real_engine_manager(tmp_path, str(bin_dir / "fakepython"))
    exp = m.exp.model_copy(
        update={"engine": m.exp.engine.model_copy(update={"model_path": str(model)})}
    )
    with pytest.raises(PreflightFailed, match=f"node local: model {model} is missing or unread"):
        model_present(exp=exp, manager=m)
    (model / "config.json").write_text("{}")
    assert model_present(exp=exp, manager=m) == {"local": str(model)}
    docker = exp.model_copy(
        update={
            "engine": exp.engine.model_copy(update={"model_path": "/data/models/k"}),
            "runtime": exp.runtime.model_copy(
                update={"kind": "docker", "image": "i", "mounts": ["/srv/m:/data/models:ro"]}
            ),
        }
    )
    assert model_on_node(docker) == "/srv/m/k"


def test_the_sims_nodes_answer_the_gpu_probe_a_foreign_process_fails_preflight(
    tmp_path: Path,
) -> None:
    m = _manager(tmp_path, engine={"port": free_port()})
    assert [g["idle"] for g in gpus_idle(exp=m.exp, manager=m)] == [True]  # 8 idle GPUs
    env = {**os.environ, GPU_MARK_ENV: f"{m.owner.checkout}:local:3"}
    foreign = subprocess.Popen(["sleep", "60"], env=env)
    try:
        with pytest.raises(PreflightFailed) as info:
            run_preflight(exp=m.exp, manager=m)
    finally:
        foreign.kill()
        foreign.wait()
    assert str(info.value) == (
        f"node local: GPU 3 busy: pid {foreign.pid} sleep 1024 MiB; memory used 1034 MiB "
        "(limit 1024 MiB, preflight.gpu_idle_max_memory_mib)"
    )


def test_a_guessed_engine_version_is_observed_not_enforced(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake(bin_dir, "fakepython", "echo 0.5.16\n")
    m = _real_engine_manager(tmp_path, str(bin_dir / "fakepython"))
    with pytest.raises(PreflightFailed, match="sglang 0.5.16 is installed, engine.version pins"):
        engine_versions(exp=m.exp, manager=m)
    guessing = m.exp.model_copy(update={"guesses": ["engine.version"]})
    assert engine_versions(exp=guessing, manager=m) == {"local": "0.5.16"}


def test_a_slurm_image_is_read_by_build_images_not_the_nodes_python(tmp_path: Path) -> None:
    """pyxis/apptainer: the SGLang that runs is the image's (build_images reads its version and
    parses the launches there); the model is found through the image's mounts. Preflight asked
    the node's python3 for sglang before, which a Slurm site's nodes need not have."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake(bin_dir, "fakepython", "echo no sglang here >&2; exit 1\n")
    m = _real_engine_manager(tmp_path, str(bin_dir / "fakepython"))
    with pytest.raises(PreflightFailed, match="no sglang package"):
        engine_versions(exp=m.exp, manager=m)
    raw = yaml.safe_load(
        (REPO / "config" / "experiments" / "moe_prefill_gate_slurm.yaml").read_text()
    )
    pyxis = load_experiment_file(
        REPO / "config" / "experiments" / "moe_prefill_gate_slurm.yaml", {}
    )
    assert pyxis.runtime.kind == "pyxis" and pyxis.runtime.imaged
    assert engine_versions(exp=pyxis, manager=m) == {}
    src, dst = raw["runtime"]["mounts"][0].split(":")[:2]
    assert model_on_node(pyxis) == src + pyxis.engine.model_path[len(dst.rstrip("/")) :]


def _sysfs(
    root: Path,
    *,
    ports: dict[str, tuple[str, dict[int, tuple[str, str]]]],
    modules: tuple[str, ...] = (),
    nvidia: str | None = None,
    kallsyms: str = "",
) -> str:
    """A node's /sys and /proc as the RDMA probe reads them: per port `dev/port` its link
    layer and GID table {index: (type, gid)}, loaded modules, the NVIDIA driver's version line,
    /proc/kallsyms."""
    for name, (link, gids) in ports.items():
        dev, port = name.split("/")
        p = root / "sys/class/infiniband" / dev / "ports" / port
        (p / "gid_attrs/types").mkdir(parents=True)
        (p / "gids").mkdir()
        (p / "state").write_text("4: ACTIVE\n")
        (p / "link_layer").write_text(f"{link}\n")
        for i, (kind, gid) in gids.items():
            (p / "gid_attrs/types" / str(i)).write_text(f"{kind}\n")
            (p / "gids" / str(i)).write_text(f"{gid}\n")
    for module in modules:
        (root / "sys/module" / module).mkdir(parents=True)
    (root / "proc/driver/nvidia").mkdir(parents=True)
    if nvidia:
        (root / "proc/driver/nvidia/version").write_text(f"NVRM version: {nvidia}\n")
    (root / "proc/kallsyms").write_text(kallsyms)
    return str(root)


# What a kernel with DRM shows on any machine, GPU or not: dma-buf core symbols.
DMA_BUF_CORE = "".join(
    f"0000000000000000 T {s}\n" for s in ("dma_buf_export", "dma_buf_fd", "dma_buf_get")
)
ZERO_GID = "0000:0000:0000:0000:0000:0000:0000:0000"


def test_gpudirect_is_decided_by_peermem_or_the_nics_dma_buf_not_by_kallsyms(
    tmp_path: Path,
) -> None:
    """A bare `dma_buf` in /proc/kallsyms (this machine's kernel has them, with no GPU and no
    NIC) is no GPUDirect RDMA: nvidia_peermem loaded, or the NVIDIA open kernel module with a
    NIC driver that registers dma-buf memory is. Each port says IB or RoCE (its RoCE v2 GID)."""
    m = _manager(tmp_path)

    def rdma(devices: list[str], root: str = "") -> tuple[list[str], str]:
        """The problems but memlock (this machine's own), and what was seen."""
        problems, seen = rdma_problems(m.exp, m, "local", devices, root=root)
        return [p for p in problems if not p.startswith("memlock")], seen

    assert subprocess.run(["grep", "-q", "dma_buf", "/proc/kallsyms"]).returncode == 0
    problems, seen = rdma([])  # this machine's own kernel
    assert any(p.startswith("no GPUDirect RDMA: nvidia_peermem not loaded") for p in problems)
    assert "GPUDirect none" in seen

    ib = {
        "mlx5_0/1": ("InfiniBand", {0: ("IB/RoCE v1", "fe80:0000:0000:0000:0000:0000:0000:0001")})
    }
    root = _sysfs(
        tmp_path / "drm-only",
        ports=ib,
        nvidia="NVIDIA UNIX x86_64 Kernel Module  570.1",
        kallsyms=DMA_BUF_CORE,
    )
    problems, seen = rdma(["mlx5_0"], root)
    assert (
        problems[-1].startswith("no GPUDirect RDMA")
        and "NIC driver dma-buf registration none" in problems[-1]
    )
    assert seen.startswith("mlx5_0/1 4:ACTIVE IB; GPUDirect none")

    root = _sysfs(tmp_path / "peermem", ports=ib, modules=("nvidia_peermem",))
    problems, seen = rdma(["mlx5_0"], root)
    assert problems == []
    assert "GPUDirect nvidia_peermem loaded" in seen

    roce = {
        "mlx5_1/1": (
            "Ethernet",
            {
                0: ("IB/RoCE v1", "fe80:0000:0000:0000:0000:0000:0000:0002"),
                1: ("RoCE v2", ZERO_GID),
                3: ("RoCE v2", "0000:0000:0000:0000:0000:ffff:0a00:0001"),
            },
        )
    }
    nic = DMA_BUF_CORE + "0000000000000000 t mlx5_ib_reg_user_mr_dmabuf\t[mlx5_ib]\n"
    open_module = "NVIDIA UNIX Open Kernel Module for x86_64  570.1"
    root = _sysfs(tmp_path / "dmabuf", ports=roce, nvidia=open_module, kallsyms=nic)
    problems, seen = rdma(["mlx5_1"], root)
    assert problems == []
    assert seen.startswith(
        "mlx5_1/1 4:ACTIVE RoCE (RoCE v2 GID 3); GPUDirect dma-buf (NVIDIA open kernel module, "
        "mlx5_ib_reg_user_mr_dmabuf)"
    )
    proprietary = "NVIDIA UNIX x86_64 Kernel Module  570.1"  # exports no dma-buf
    root = _sysfs(tmp_path / "proprietary", ports=roce, nvidia=proprietary, kallsyms=nic)
    problems, _ = rdma(["mlx5_1"], root)
    assert any("NVIDIA open kernel module no" in p for p in problems)

    no_ip = {"mlx5_2/1": ("Ethernet", {0: ("IB/RoCE v1", "fe80::3"), 1: ("RoCE v2", ZERO_GID)})}
    root = _sysfs(tmp_path / "no-ip", ports=no_ip, modules=("nvidia_peermem",))
    problems, seen = rdma(["mlx5_2"], root)
    assert problems[0] == "mlx5_2/1 is RoCE with no RoCE v2 GID (no IP address on its interface?)"
    assert seen.startswith("mlx5_2/1 4:ACTIVE RoCE (RoCE v2 GID none)")
