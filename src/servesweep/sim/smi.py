"""The sim's nvidia-smi: the GPU and compute-app queries preflight sends, answered for a simulated
node from the processes that hold its GPUs, so the idle-GPU check runs on the sim as on a node.

    python -m servesweep.sim.smi --sim-node NODE --sim-gpus N --sim-scope TAG \\
        [--sim-holder K=V ...] --query-gpu=index,pci.bus_id,memory.used --format=csv

A simulated node's GPUs are held by (a) every process whose environment carries all the
`--sim-holder` entries (the caller passes its servers' labels for NODE: a sim server holds
every GPU of its node) and (b) every process whose environment has GPU_MARK_ENV set to
`TAG:NODE:i[,j...]` (a foreign process in a test). The scope TAG keeps one checkout's
simulated nodes apart from another's on a shared machine. The output is the real format of
one H200 (tests/data/nvidia-smi), one line per GPU or per process and GPU.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

GPU_MARK_ENV = "SERVESWEEP_SIM_GPU"
SERVER_MIB = 73520  # what SGLang 0.5.17's scheduler held on the H200 rehearsal
MARKED_MIB = 1024
OVERHEAD_MIB = 10  # memory.used beyond the processes' (the real probe: 73530 for 73520)


def _environ(pid: str) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(e.split("=", 1) for e in raw.decode(errors="replace").split("\0") if "=" in e)


def _name(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def _engine(pid: str) -> bool:
    """A sim engine process (its router holds no GPU)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"servesweep.sim" in argv and b"servesweep.sim.router" not in argv


def holders(
    *, node: str, gpus: int, scope: str, holder: dict[str, str]
) -> list[tuple[int, str, str, int]]:
    """(gpu index, pid, process name, MiB) of every process holding a GPU of `node`."""
    held = []
    for entry in sorted(Path("/proc").glob("[0-9]*"), key=lambda p: int(p.name)):
        env = _environ(entry.name)
        if not env:
            continue
        mark = env.get(GPU_MARK_ENV, "")
        if mark.count(":") == 2:
            tag, where, indices = mark.split(":")
            if (tag, where) == (scope, node):
                held += [
                    (int(i), entry.name, _name(entry.name), MARKED_MIB) for i in indices.split(",")
                ]
            continue
        if holder and all(env.get(k) == v for k, v in holder.items()):
            visible = env.get("CUDA_VISIBLE_DEVICES")  # a node that is a slice of its host
            indices = [int(i) for i in visible.split(",")] if visible else range(gpus)
            held += [(i, entry.name, _name(entry.name), SERVER_MIB) for i in indices]
    return [h for h in held if 0 <= h[0] < gpus]


def bus_id(index: int) -> str:
    return f"00000000:{index + 6:02X}:00.0"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="servesweep.sim.smi")
    ap.add_argument("--sim-node", required=True)
    ap.add_argument("--sim-gpus", type=int, required=True)
    ap.add_argument("--sim-scope", required=True)
    ap.add_argument("--sim-holder", action="append", default=[])
    ap.add_argument("--query-gpu")
    ap.add_argument("--query-compute-apps")
    ap.add_argument("--format")
    a = ap.parse_args(argv)
    holder = dict(h.split("=", 1) for h in a.sim_holder)
    held = holders(node=a.sim_node, gpus=a.sim_gpus, scope=a.sim_scope, holder=holder)
    if a.query_gpu == "index,pci.bus_id,memory.used" and a.format == "csv":
        print("index, pci.bus_id, memory.used [MiB]")
        for i in range(a.sim_gpus):
            used = sum(h[3] for h in held if h[0] == i)
            print(f"{i}, {bus_id(i)}, {used + OVERHEAD_MIB if used else 0} MiB")
        return 0
    if a.query_compute_apps == "gpu_bus_id,pid,process_name,used_memory" and a.format == "csv":
        print("gpu_bus_id, pid, process_name, used_gpu_memory [MiB]")
        for index, pid, name, mib in held:
            print(f"{bus_id(index)}, {pid}, {name}, {mib} MiB")
        return 0
    print(f"sim nvidia-smi: unsupported arguments: {' '.join(sys.argv[1:])}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
