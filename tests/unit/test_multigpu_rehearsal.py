"""The multi-GPU rehearsal configs (issue 31), ready for a machine with 4 H200s: what they
would launch, checked here where no such machine is lent."""

from __future__ import annotations

import re

import pytest

from servesweep.config.load import load_experiment_file
from servesweep.config.matrix import cell_repeats, server_specs
from servesweep.workflow.cli import main
from tests.helpers import REPO

CONFIGS = REPO / "config" / "experiments"


def commands(name: str, capsys: pytest.CaptureFixture[str]) -> tuple[list[str], str]:
    assert main(["commands", "--configfile", str(CONFIGS / f"{name}.yaml")]) == 0
    out = capsys.readouterr()
    return out.out.splitlines(), out.err


def test_tp_ep_across_the_hosts_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    exp = load_experiment_file(CONFIGS / "h200x4_rehearsal.yaml", {})
    assert len(server_specs(exp)) == 2 and len(cell_repeats(exp)) == 2 * 2 * 3
    lines, _ = commands("h200x4_rehearsal", capsys)
    launches = [ln for ln in lines if "sglang.launch_server" in ln]
    assert len(launches) == 2
    assert all("--tp-size 4 --ep-size 4" in ln for ln in launches)
    assert all("NCCL_NVLS_ENABLE=0" in ln for ln in launches)


def test_pd_on_separate_gpus_of_one_host(capsys: pytest.CaptureFixture[str]) -> None:
    exp = load_experiment_file(CONFIGS / "h200x4_pd_rehearsal.yaml", {})
    assert len(cell_repeats(exp)) == 6  # seed 003's six cases
    lines, err = commands("h200x4_pd_rehearsal", capsys)
    prefill, decode, router = (
        next(ln for ln in lines if f"SERVESWEEP_LABEL_ROLE={role}" in ln)
        for role in ("prefill", "decode", "router")
    )
    assert "CUDA_VISIBLE_DEVICES=0,1" in prefill and "--disaggregation-mode prefill" in prefill
    assert "CUDA_VISIBLE_DEVICES=2,3" in decode and "--disaggregation-mode decode" in decode
    assert (
        "MOONCAKE_PROTOCOL=tcp" in prefill
        and "--disaggregation-transfer-backend mooncake" in prefill
    )
    assert "CUDA_VISIBLE_DEVICES" not in router and "sglang_router.launch_router" in router
    # "auto" ports are shown as real ones, the same in the router's and the clients' lines
    assert not re.search(r"--port (0|auto)\b|127\.0\.0\.1:(0|auto)\b", "\n".join(lines))
    decode_port = re.search(r"--port (\d+)", decode).group(1)
    assert f"--decode http://127.0.0.1:{decode_port}" in router
    router_port = re.search(r"--port (\d+)", router).group(1)
    clients = [ln for ln in lines if "loadgen.builtin" in ln]
    assert len(clients) == 6 and all(f"127.0.0.1:{router_port} " in ln for ln in clients)
    assert "warning: runtime.env.MOONCAKE_PROTOCOL = 'tcp' is a guess" in err


def test_pd_on_one_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    """Seed 003's flow on one GPU (h200_pd_rehearsal.yaml): both roles on GPU 0 with their
    memory shares, the six cases and seed 003's suites, 3 repeats; the GPU is read once."""
    exp = load_experiment_file(CONFIGS / "h200_pd_rehearsal.yaml", {})
    assert exp.cluster.gpu_ids == {"p0": [0], "d0": [0]} and exp.cluster.gpus_per_node == 1
    assert len(cell_repeats(exp)) == 6 * 3
    assert exp.suites == {
        "standard": ["64-8-c1", "1k-16-c1-nonstream", "16k-1-c1", "16k-1-c8"],
        "decode512": ["16k-512-c1"],
        "decode512-c8": ["16k-512-c8"],
    }
    standard = load_experiment_file(CONFIGS / "h200_pd_rehearsal.yaml", {"SUITE": "standard"})
    assert len(cell_repeats(standard)) == 4 * 3
    assert {n: exp.cluster.telemetry_gpus(n) for n in exp.cluster.nodes} == {"p0": [0], "d0": []}
    lines, err = commands("h200_pd_rehearsal", capsys)
    prefill, decode, router = (
        next(ln for ln in lines if f"SERVESWEEP_LABEL_ROLE={role}" in ln)
        for role in ("prefill", "decode", "router")
    )
    for line, mode in ((prefill, "prefill"), (decode, "decode")):
        assert "CUDA_VISIBLE_DEVICES=0 " in line and f"--disaggregation-mode {mode}" in line
        assert "--mem-fraction-static 0.3" in line and "--cuda-graph-max-bs 8" in line
    assert "CUDA_VISIBLE_DEVICES" not in router and "sglang_router.launch_router" in router
    assert lines.index(next(ln for ln in lines if "role prefill" in ln)) < lines.index(
        next(ln for ln in lines if "role decode" in ln)
    )  # prefill starts (and is ready) before decode
    assert "warning: runtime.env.MOONCAKE_PROTOCOL = 'tcp' is a guess" in err
