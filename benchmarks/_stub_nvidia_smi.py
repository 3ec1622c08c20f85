#!/usr/bin/env python3
"""A stub `nvidia-smi` for `gpu_sampler_check.py --smoke` on a machine without a GPU.

Answers the sampler's loop (`--query-gpu=FIELDS --format=csv,noheader,nounits --loop-ms=N`)
with one GPU's lines in the recorded H200's ranges (tests/data/nvidia-smi-h200-check/):
idle (80 W, 0 % SM) while the file named by $STUB_NVIDIA_SMI_LOAD_FILE is absent, loaded
(690 W, 99 % SM) while it exists. `--query-gpu` alone prints one line and exits. Only the
standard library: it runs under whatever `python3` is on PATH.
"""

import datetime as dt
import os
import sys
import time

IDLE = {"power.draw": 80.0, "utilization.gpu": 0, "utilization.memory": 0, "memory.used": 621}
LOAD = {"power.draw": 690.0, "utilization.gpu": 99, "utilization.memory": 60, "memory.used": 1103}
FIXED = {
    "index": 0,
    "uuid": "GPU-00000000-stub-0000-0000-000000000000",
    "name": "NVIDIA H200 (stub)",
    "power.limit": 700.0,
    "memory.total": 143771,
    "clocks.sm": 1980,
    "clocks.mem": 3201,
    "temperature.gpu": 37,
    "pstate": "P0",
}


def line(fields: list[str]) -> str:
    load_file = os.environ.get("STUB_NVIDIA_SMI_LOAD_FILE")
    values = {**FIXED, **(LOAD if load_file and os.path.exists(load_file) else IDLE)}
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]  # noqa: UP017 (any python3)
    return ", ".join(now if f == "timestamp" else str(values.get(f, 0)) for f in fields)


def main(argv: list[str]) -> int:
    opts = dict(a.lstrip("-").split("=", 1) for a in argv if "=" in a)
    fields = opts.get("query-gpu", "timestamp,power.draw").split(",")
    if "loop-ms" not in opts:
        print(line(fields), flush=True)
        return 0
    interval = int(opts["loop-ms"]) / 1000
    while True:
        print(line(fields), flush=True)
        time.sleep(interval)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
