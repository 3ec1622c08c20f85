"""Are a node's GPUs idle? nvidia-smi's GPU and compute-app queries, parsed and judged."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# Both with a header (`--format=csv`), so recorded captures parse as they are.
GPU_QUERY = "--query-gpu=index,pci.bus_id,memory.used --format=csv"
APPS_QUERY = "--query-compute-apps=gpu_bus_id,pid,process_name,used_memory --format=csv"
SEPARATOR = "@@apps"


def probe_command(smi: str = "nvidia-smi") -> str:
    """One shell command printing both queries, separated by SEPARATOR (`smi`: the command
    that answers them; the sim's nodes have their own)."""
    return f"{smi} {GPU_QUERY} && echo {SEPARATOR} && {smi} {APPS_QUERY}"


@dataclass(frozen=True)
class GpuState:
    """One GPU: index, memory in use, and the compute processes on it."""

    index: str
    bus_id: str
    used_mib: float
    processes: tuple[str, ...]  # "pid 420 python3 21482 MiB"
    pids: tuple[int, ...] = ()


def _table(text: str) -> list[dict[str, str]]:
    rows = list(csv.reader(io.StringIO(text.strip())))
    if not rows:
        return []
    header = [h.strip().split(" [")[0] for h in rows[0]]
    return [dict(zip(header, (c.strip() for c in r), strict=False)) for r in rows[1:] if r]


def _mib(value: str) -> float:
    return float(value.replace("MiB", "").strip() or 0)


def parse(gpu_csv: str, apps_csv: str) -> list[GpuState]:
    """GPUs from `GPU_QUERY` output, each with the processes of `APPS_QUERY` on it (an app
    without a bus id, as in an older query, is put on the only GPU, or on every GPU)."""
    gpus = _table(gpu_csv)
    apps = _table(apps_csv)
    states = []
    for gpu in gpus:
        bus = gpu.get("pci.bus_id", "")
        mine = [
            a
            for a in apps
            if a.get("gpu_bus_id", bus) == bus or "gpu_bus_id" not in a and len(gpus) == 1
        ]
        states.append(
            GpuState(
                index=gpu.get("index", "?"),
                bus_id=bus,
                used_mib=_mib(gpu.get("memory.used", "0")),
                processes=tuple(
                    f"pid {a.get('pid', '?')} {a.get('process_name', '?')} "
                    f"{_mib(a.get('used_gpu_memory', a.get('used_memory', '0'))):.0f} MiB"
                    for a in mine
                ),
                pids=tuple(int(a["pid"]) for a in mine if a.get("pid", "").isdigit()),
            )
        )
    return states


def held_by_ours(gpu: GpuState, ours: Mapping[int, str]) -> str | None:
    """What of ours holds `gpu` (the server a run will reuse) when every compute process on it
    is in `ours` (pid -> server), else None."""
    if not gpu.pids or len(gpu.pids) != len(gpu.processes):
        return None
    holders = [ours.get(pid) for pid in gpu.pids]
    return None if None in holders else ", ".join(dict.fromkeys(h for h in holders if h))


def busy_reason(
    node: str,
    states: list[GpuState],
    *,
    expected: int,
    max_used_mib: float,
    ours: Mapping[int, str] | None = None,
) -> str | None:
    """None when `expected` GPUs are idle or held only by `ours` (pid -> the server of ours a
    run reuses), else one line naming node, GPU, pid and memory."""
    if len(states) != expected:
        return f"node {node}: {len(states)} GPUs, cluster.gpus_per_node says {expected}"
    for gpu in states:
        if held_by_ours(gpu, ours or {}):
            continue
        if gpu.processes or gpu.used_mib > max_used_mib:
            who = "; ".join(gpu.processes) or "no process listed"
            return (
                f"node {node}: GPU {gpu.index} busy: {who}; memory used {gpu.used_mib:.0f} MiB "
                f"(limit {max_used_mib:.0f} MiB, preflight.gpu_idle_max_memory_mib)"
            )
    return None


def split_probe(output: str) -> tuple[str, str]:
    """(GPU csv, apps csv) of `probe_command`'s output."""
    gpu, _, apps = output.partition(SEPARATOR)
    return gpu, apps


def judge_probe(
    node: str,
    output: str,
    *,
    expected: int,
    max_used_mib: float,
    ours: Mapping[int, str] | None = None,
    visible: Sequence[int] | None = None,
) -> tuple[int, str | None]:
    """(GPUs seen, busy_reason) of `probe_command`'s output on `node`; with `visible` (the
    node's `cluster.gpu_ids`), only those GPUs of its host count."""
    states = parse(*split_probe(output))
    if visible is not None:
        shown = {gpu.index for gpu in states}
        absent = [i for i in visible if str(i) not in shown]
        if absent:
            return len(states), (
                f"node {node}: GPU {absent[0]} of cluster.gpu_ids is not among its host's "
                f"GPUs ({', '.join(sorted(shown)) or 'none'})"
            )
        states = [gpu for gpu in states if gpu.index in {str(i) for i in visible}]
    reason = busy_reason(node, states, expected=expected, max_used_mib=max_used_mib, ours=ours)
    return len(states), reason
