"""Check the GPU sampler on a real GPU: the cell's nvidia-smi loop beside a torch bf16 matmul
loop (idle, load, idle); writes the capture and a summary to OUT_DIR.

    python benchmarks/gpu_sampler_check.py OUT_DIR [--idle-s 10] [--load-s 30] [--interval-ms 500]

Needs nvidia-smi on PATH and torch with CUDA. OUT_DIR gets `samples.csv` (the loop's output
exactly as nvidia-smi printed it), `phases.json` (epoch seconds of idle/load/idle) and
`summary.json` (power, SM utilisation and energy per phase, from servesweep.cluster.gpusampling).
Copy `samples.csv` and `phases.json` to tests/data/nvidia-smi-h200-check/ to make them the
fixture of tests/unit/test_gpusampling.py::test_real_gpu_capture_rises_and_falls_with_the_load.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

from servesweep.analysis import gpufigures
from servesweep.cluster import gpusampling
from servesweep.cluster.transport import LocalTransport
from servesweep.core.files import write_text_atomic

NODE = "local"


def matmul_load(seconds: float, *, size: int = 8192) -> int:
    """A bf16 matmul loop on GPU 0 for `seconds`; returns the number of matmuls."""
    import torch

    a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
    n = 0
    end = time.time() + seconds
    while time.time() < end:
        for _ in range(20):
            a @ b
        torch.cuda.synchronize()
        n += 20
    del a, b
    torch.cuda.empty_cache()
    return n


def phase_figures(rows: list[dict], start: float, end: float) -> dict:
    """The sampler's figures over one phase."""
    figures = gpufigures.sample_figures(rows + gpusampling.window_rows(start, end))
    keep = ("gpu_energy_j", "gpu_power_mean_w", "gpu_power_peak_w", "gpu_util_mean_pct")
    return {k: figures[k] for k in (*keep, "gpu_samples", "gpu_mem_used_peak_mib")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--load-s", type=float, default=30.0)
    parser.add_argument("--interval-ms", type=int, default=500)
    args = parser.parse_args(argv)
    if shutil.which("nvidia-smi") is None:
        print("nvidia-smi is not on PATH: run this on a GPU machine", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("torch sees no CUDA device", file=sys.stderr)
        return 2
    torch.zeros(1, device="cuda")  # CUDA context before the first idle phase
    args.out_dir.mkdir(parents=True, exist_ok=True)
    sampler = gpusampling.NvidiaSmiSampler(
        transport=LocalTransport(),
        nodes=[NODE],
        interval_ms=args.interval_ms,
        remote_dir=tempfile.mkdtemp(prefix="gpu-sampler-check-"),
    )
    phases: dict[str, float] = {}
    sampler.start()
    if not sampler.pids:
        print(f"sampler did not start: {sampler.rows}", file=sys.stderr)
        return 1
    try:
        time.sleep(0.5)  # the loop's first line
        phases["idle_start"] = time.time()
        time.sleep(args.idle_s)
        phases["load_start"] = time.time()
        matmuls = matmul_load(args.load_s)
        phases["load_end"] = time.time()
        time.sleep(args.idle_s)
        phases["idle_end"] = time.time()
    finally:
        rows = sampler.stop()
    raw = sampler.raw.get(NODE, "")
    write_text_atomic(args.out_dir / "samples.csv", raw)
    write_text_atomic(args.out_dir / "phases.json", json.dumps(phases, indent=2) + "\n")
    summary = {
        "host": platform.node(),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "interval_ms": args.interval_ms,
        "matmuls": matmuls,
        "lines": len(raw.splitlines()),
        "idle_before": phase_figures(rows, phases["idle_start"], phases["load_start"]),
        "load": phase_figures(rows, phases["load_start"], phases["load_end"]),
        "idle_after": phase_figures(rows, phases["load_end"], phases["idle_end"]),
    }
    write_text_atomic(args.out_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    for name in ("idle_before", "load", "idle_after"):
        f = summary[name]
        print(
            f"{name:11s} mean {f['gpu_power_mean_w']:7.1f} W  peak {f['gpu_power_peak_w']:7.1f} W"
            f"  SM {f['gpu_util_mean_pct']:5.1f} %  energy {f['gpu_energy_j']:9.1f} J"
            f"  samples {f['gpu_samples']}"
        )
    print(f"wrote {args.out_dir}/samples.csv, phases.json, summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
