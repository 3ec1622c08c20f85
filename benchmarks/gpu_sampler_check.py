"""Check the GPU sampler on a real GPU: the cell's nvidia-smi loop beside a torch bf16 matmul
loop (idle, load, idle); writes the capture and a summary to OUT_DIR.

    python benchmarks/gpu_sampler_check.py [OUT_DIR] [--idle-s 10] [--load-s 30]
                                           [--interval-ms 500] [--smoke]

Needs nvidia-smi on PATH and torch with CUDA. OUT_DIR (`--smoke`: by default
$TMPDIR/servesweep-bench-smoke/gpu_sampler_check) gets
`samples.csv` (the loop's output exactly as nvidia-smi printed it), `phases.json` (epoch
seconds of idle/load/idle) and `summary.json` (power, SM utilisation and energy per phase, from
servesweep.cluster.gpusampling). Copy `samples.csv` and `phases.json` to
tests/data/nvidia-smi-h200-check/ to make them the fixture of
tests/unit/test_gpusampling.py::test_real_gpu_capture_rises_and_falls_with_the_load.

Phase boundaries (phase_windows): a sample reports the power of the interval before it, so the
first sample after the load's end still holds load. The idle phase after the load starts at
the first sample at least one interval after the load's end, the idle phase before it ends at
the last sample before the load's start; neither is interpolated across the load's edge.

Checks (exit 1, each failure named; none is a timing, so `--smoke` enforces them all): samples
in every phase; load power above idle power (x1.2); SM utilisation under load >= 80 %; the idle
phase after the load back within 25 % of the idle power before it. `--smoke` is 1 s idle, 2 s
load, 1 s idle at 200 ms; without torch+CUDA its load is the stub's: it uses the nvidia-smi on
PATH, else benchmarks/_stub_nvidia_smi.py, and signals the load through the file
$STUB_NVIDIA_SMI_LOAD_FILE (a real nvidia-smi ignores it, so a smoke run on a GPU machine
without torch fails the load checks, as it should).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from _common import SMOKE_DIR, Check, check_rows, verdict

from servesweep.analysis import gpufigures
from servesweep.cluster import gpusampling
from servesweep.cluster.transport import LocalTransport
from servesweep.core import gpufile
from servesweep.core.files import write_text_atomic

NODE = "local"
STUB = Path(__file__).resolve().parent / "_stub_nvidia_smi.py"
LOAD_FILE_ENV = "STUB_NVIDIA_SMI_LOAD_FILE"
PHASES = ("idle_before", "load", "idle_after")
LOAD_OVER_IDLE = 1.2  # load mean power at least this many times the idle power before it
MIN_LOAD_UTIL_PCT = 80.0
IDLE_AFTER_TOLERANCE = 0.25  # idle after the load within this fraction of the idle before


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


def stub_load(seconds: float, *, load_file: Path) -> int:
    """The stub nvidia-smi's load: `load_file` exists for `seconds` (smoke runs without CUDA)."""
    load_file.write_text("load\n")
    try:
        time.sleep(seconds)
    finally:
        load_file.unlink(missing_ok=True)
    return 0


def cuda_torch() -> Any:
    """torch, if it sees a CUDA device; else None."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def phase_windows(
    phases: dict[str, float], *, sample_times: Sequence[float], interval_s: float
) -> dict[str, tuple[float, float]]:
    """Each phase's window. A sample reports the interval before it: the idle phase after the
    load starts at the first sample at least one interval after the load's end (earlier ones
    still hold load), the one before ends at the last sample before the load's start."""
    times = sorted(sample_times)
    after = [t for t in times if t >= phases["load_end"] + interval_s]
    before = [t for t in times if phases["idle_start"] < t <= phases["load_start"]]
    idle_after_start = after[0] if after else phases["idle_end"]
    return {
        "idle_before": (phases["idle_start"], before[-1] if before else phases["load_start"]),
        "load": (phases["load_start"], phases["load_end"]),
        "idle_after": (min(idle_after_start, phases["idle_end"]), phases["idle_end"]),
    }


def sample_times(rows: list[dict]) -> list[float]:
    samples = [r for r in rows if r.get("phase") == gpufile.PHASE_SAMPLE and r.get("timestamp")]
    return [gpufile.parse_timestamp(str(r["timestamp"])) for r in samples]


def phase_figures(rows: list[dict], start: float, end: float) -> dict:
    """The sampler's figures over one phase."""
    figures = gpufigures.sample_figures(rows + gpusampling.window_rows(start, end))
    keep = ("gpu_energy_j", "gpu_power_mean_w", "gpu_power_peak_w", "gpu_util_mean_pct")
    return {k: figures[k] for k in (*keep, "gpu_samples", "gpu_mem_used_peak_mib")}


def checks(summary: dict[str, Any]) -> list[Check]:
    """Sanity bounds and the goal: the sampler sees the load rise and fall."""
    idle, load, after = (summary[p] for p in PHASES)
    counts = ", ".join(f"{p} {summary[p]['gpu_samples']}" for p in PHASES)
    idle_w, load_w, after_w = (f["gpu_power_mean_w"] for f in (idle, load, after))
    return [
        Check("samples in every phase", all(summary[p]["gpu_samples"] > 0 for p in PHASES), counts),
        Check(
            f"load power above idle power (x{LOAD_OVER_IDLE})",
            load_w > LOAD_OVER_IDLE * idle_w,
            f"load {load_w:.1f} W, idle {idle_w:.1f} W",
        ),
        Check(
            f"SM utilisation under load >= {MIN_LOAD_UTIL_PCT:.0f} %",
            load["gpu_util_mean_pct"] >= MIN_LOAD_UTIL_PCT,
            f"{load['gpu_util_mean_pct']:.1f} %",
        ),
        Check(
            f"idle after the load within {IDLE_AFTER_TOLERANCE:.0%} of idle before",
            abs(after_w - idle_w) <= IDLE_AFTER_TOLERANCE * idle_w,
            f"after {after_w:.1f} W, before {idle_w:.1f} W",
        ),
    ]


@contextlib.contextmanager
def nvidia_smi_on_path(tmp: Path) -> Iterator[str]:
    """The nvidia-smi on PATH, else the stub (PATH extended for this process and its loop)."""
    found = shutil.which("nvidia-smi")
    if found:
        yield found
        return
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(STUB)
    saved = os.environ["PATH"]
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{saved}"
    try:
        yield f"{bin_dir / 'nvidia-smi'} (stub: {STUB.name})"
    finally:
        os.environ["PATH"] = saved


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path, nargs="?", default=None)
    parser.add_argument("--idle-s", type=float, default=None, help="default 10 (smoke: 1)")
    parser.add_argument("--load-s", type=float, default=None, help="default 30 (smoke: 2)")
    parser.add_argument("--interval-ms", type=int, default=None, help="default 500 (smoke: 200)")
    parser.add_argument("--smoke", action="store_true", help="seconds; a stub without a GPU")
    args = parser.parse_args(argv)
    args.idle_s = args.idle_s if args.idle_s is not None else (1.0 if args.smoke else 10.0)
    args.load_s = args.load_s if args.load_s is not None else (2.0 if args.smoke else 30.0)
    args.interval_ms = args.interval_ms or (200 if args.smoke else 500)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpu-sampler-check-") as scratch:
        tmp = Path(scratch)
        out_dir = args.out_dir or (SMOKE_DIR / "gpu_sampler_check" if args.smoke else None)
        if out_dir is None:
            print("OUT_DIR is required without --smoke", file=sys.stderr)
            return 2
        if args.smoke:
            with nvidia_smi_on_path(tmp) as smi:
                return measure(args, out_dir=out_dir, tmp=tmp, smi=smi)
        smi = shutil.which("nvidia-smi")
        if smi is None:
            print("nvidia-smi is not on PATH: run this on a GPU machine", file=sys.stderr)
            return 2
        return measure(args, out_dir=out_dir, tmp=tmp, smi=smi)


def measure(args: argparse.Namespace, *, out_dir: Path, tmp: Path, smi: str) -> int:
    torch = cuda_torch()
    if torch is None and not args.smoke:
        print("torch sees no CUDA device", file=sys.stderr)
        return 2
    if torch is not None:
        torch.zeros(1, device="cuda")  # CUDA context before the first idle phase
        gpu, version = torch.cuda.get_device_name(0), torch.__version__
    else:
        load_file = tmp / "load"
        os.environ[LOAD_FILE_ENV] = str(load_file)
        gpu, version = f"none: the stub's load ({LOAD_FILE_ENV})", None
        print(f"smoke: no torch with CUDA; the load is {LOAD_FILE_ENV} for {smi}")
    out_dir.mkdir(parents=True, exist_ok=True)
    total_s = 2 * args.idle_s + args.load_s
    sampler = gpusampling.NvidiaSmiSampler(
        transport=LocalTransport(),
        nodes=[NODE],
        interval_ms=args.interval_ms,
        remote_dir=str(tmp / "loop"),
        max_s=int(total_s) + 120,  # the loop ends by itself if this process is killed
    )
    phases: dict[str, float] = {}
    sampler.start()
    if not sampler.pids:
        print(f"FAILED: sampler did not start: {sampler.rows}", file=sys.stderr)
        return 1
    try:
        time.sleep(max(0.5, 2 * args.interval_ms / 1000))  # the loop's first line
        phases["idle_start"] = time.time()
        time.sleep(args.idle_s)
        phases["load_start"] = time.time()
        if torch is not None:
            matmuls = matmul_load(args.load_s)
        else:
            matmuls = stub_load(args.load_s, load_file=load_file)
        phases["load_end"] = time.time()
        time.sleep(args.idle_s + args.interval_ms / 1000)  # the idle phase starts 1 tick late
        phases["idle_end"] = time.time()
    finally:
        rows = sampler.stop()
    raw = sampler.raw.get(NODE, "")
    windows = phase_windows(
        phases, sample_times=sample_times(rows), interval_s=args.interval_ms / 1000
    )
    write_text_atomic(out_dir / "samples.csv", raw)
    write_text_atomic(out_dir / "phases.json", json.dumps(phases, indent=2) + "\n")
    summary: dict[str, Any] = {
        "host": platform.node(),
        "gpu": gpu,
        "torch": version,
        "nvidia_smi": smi,
        "smoke": args.smoke,
        "interval_ms": args.interval_ms,
        "matmuls": matmuls,
        "lines": len(raw.splitlines()),
        "windows": windows,
        **{name: phase_figures(rows, *windows[name]) for name in PHASES},
    }
    found = checks(summary)
    summary["checks"] = check_rows(found, smoke=args.smoke)
    write_text_atomic(out_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    for name in PHASES:
        f = summary[name]
        print(
            f"{name:11s} mean {f['gpu_power_mean_w']:7.1f} W  peak {f['gpu_power_peak_w']:7.1f} W"
            f"  SM {f['gpu_util_mean_pct']:5.1f} %  energy {f['gpu_energy_j']:9.1f} J"
            f"  samples {f['gpu_samples']}"
        )
    print(f"wrote {out_dir}/samples.csv, phases.json, summary.json")
    return verdict(found, smoke=args.smoke)


if __name__ == "__main__":
    sys.exit(main())
