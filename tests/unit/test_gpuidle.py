"""Tests of servesweep.cluster.gpuidle on recorded nvidia-smi output of a real H200."""

from __future__ import annotations

from servesweep.cluster import gpuidle
from tests.support.runs import DATA

SMI = DATA / "nvidia-smi"


def test_idle_capture_is_idle() -> None:
    states = gpuidle.parse((SMI / "query-idle.csv").read_text(), "pid, process_name\n")
    assert [(s.index, s.used_mib, s.processes) for s in states] == [("0", 0.0, ())]
    assert gpuidle.busy_reason("n601", states, expected=1, max_used_mib=1024) is None


def test_a_process_on_the_gpu_is_one_line_naming_node_gpu_pid_and_memory() -> None:
    states = gpuidle.parse(
        (SMI / "query-load.csv").read_text(), (SMI / "compute-apps-load.csv").read_text()
    )
    reason = gpuidle.busy_reason("n601", states, expected=1, max_used_mib=1024)
    assert reason is not None and "\n" not in reason
    assert reason.startswith("node n601: GPU 0 busy: pid 420 python3 21482 MiB")
    assert "memory used 21491 MiB" in reason


def test_wrong_gpu_count_and_memory_alone() -> None:
    idle = gpuidle.parse((SMI / "query-idle.csv").read_text(), "")
    reason = gpuidle.busy_reason("n1", idle, expected=8, max_used_mib=1024)
    assert reason == "node n1: 1 GPUs, cluster.gpus_per_node says 8"
    used = [gpuidle.GpuState("3", "b", 4096.0, ())]
    assert "GPU 3 busy: no process listed" in (
        gpuidle.busy_reason("n1", used, expected=1, max_used_mib=1024) or ""
    )


def test_probe_output_splits() -> None:
    gpu, apps = gpuidle.split_probe(f"a\n{gpuidle.SEPARATOR}\nb\n")
    assert gpu.strip() == "a" and apps.strip() == "b"
