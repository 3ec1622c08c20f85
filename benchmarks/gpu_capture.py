"""Record nvidia-smi's sampling loop beside a real GPU load: the fixture of the telemetry tests.

    python benchmarks/gpu_capture.py OUT [--idle-s 10] [--load-s 30] [--loop-ms 1000]

Needs a GPU, `nvidia-smi` and torch. Runs the query the workflow sends
(`servesweep.telemetry.QUERY_FIELDS`, `--format=csv,noheader,nounits`) with `--loop-ms`, for
`idle-s` seconds idle, `load-s` seconds of a bf16 8192x8192 matmul loop, and `idle-s` idle again.
Writes OUT/loop-noheader-nounits.csv (nvidia-smi's output, unchanged) and OUT/phases.json (the
wall-clock times at which the load started and ended, and the commands). Stops nvidia-smi by pid.
"""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from servesweep.telemetry import QUERY_FIELDS  # noqa: E402  (stdlib-only module)


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def matmul_load(seconds: float) -> int:
    """bf16 8192^3 products back to back for `seconds`; returns how many ran."""
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        n += 10
    return n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--idle-s", type=float, default=10.0)
    p.add_argument("--load-s", type=float, default=30.0)
    p.add_argument("--loop-ms", type=int, default=1000)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    argv = [
        "nvidia-smi",
        f"--query-gpu={','.join(QUERY_FIELDS)}",
        "--format=csv,noheader,nounits",
        f"--loop-ms={args.loop_ms}",
    ]
    phases: dict[str, object] = {"command": shlex.join(argv), "sampler_started": now()}
    with open(args.out / "loop-noheader-nounits.csv", "w") as fh:
        sampler = subprocess.Popen(argv, stdout=fh, stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(args.idle_s)
            phases["load_started"] = now()
            phases["matmuls"] = matmul_load(args.load_s)
            phases["load_ended"] = now()
            time.sleep(args.idle_s)
        finally:
            sampler.send_signal(signal.SIGTERM)
            _, err = sampler.communicate(timeout=10)
    phases["sampler_stopped"] = now()
    phases["sampler_stderr"] = err
    (args.out / "phases.json").write_text(json.dumps(phases, indent=2) + "\n")
    print(json.dumps(phases))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
