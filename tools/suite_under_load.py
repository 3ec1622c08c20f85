"""Run a test command N times in a row beside a synthetic load (one busy loop per core) and
record each run in benchmarks/results/ci.json: wall time, the load it ran under, pytest's counts.

    python3 tools/suite_under_load.py --runs 2            # the README's test command
    python3 tools/suite_under_load.py --runs 1 --ci       # .ci/run itself (CI's wall time)

The busy loops are this script's own children, stopped by pid when the runs end. Exit 1 when a
run fails (or collected no test), so "passes N runs in a row" is this script's exit status.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import multiprocessing
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The README's second command (Tests), as a user runs it.
INSTALL = "pip install -q -c requirements-lock.txt -e '.[test]' && "
README_COMMAND = "bash .ci/setup_nodes.sh && bash .ci/setup_slurm.sh >/dev/null && pytest"
CI_COMMAND = "bash .ci/run"
SUMMARY = re.compile(r"=+ (.*\b(?:passed|failed|error)\b.*) in ([\d.]+)s")


def busy() -> None:  # one core's worth of load
    while True:
        pass


def counts(text: str) -> dict[str, int]:
    """pytest's last summary line as counts: {"passed": 1170, "failed": 0, ...}."""
    found = SUMMARY.findall(text)
    if not found:
        return {}
    return {k: int(n) for n, k in re.findall(r"(\d+) (\w+)", found[-1][0])}


def run_once(command: str, log: Path) -> dict:
    samples: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(10.0):
            samples.append(float(Path("/proc/loadavg").read_text().split()[0]))

    sampler = threading.Thread(target=sample, daemon=True)
    started = dt.datetime.now(dt.UTC)
    t0 = time.monotonic()
    sampler.start()
    with log.open("w") as out:
        rc = subprocess.run(
            ["bash", "-c", command], cwd=REPO, stdout=out, stderr=subprocess.STDOUT
        ).returncode
    wall = time.monotonic() - t0
    done.set()
    found = counts(log.read_text(errors="replace"))
    return {
        "started": started.isoformat(timespec="seconds"),
        "command": command,
        "rc": rc,
        "wall_s": round(wall, 1),
        "load": round(sum(samples) / len(samples), 2) if samples else None,
        "load_max": max(samples) if samples else None,
        "passed": found.get("passed", 0),
        "failed": found.get("failed", 0) + found.get("error", 0) + found.get("errors", 0),
        "skipped": found.get("skipped", 0),
        "log": str(log),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--ci", action="store_true", help="time .ci/run instead of the README's")
    ap.add_argument("--no-load", action="store_true", help="no busy loops (a baseline)")
    ap.add_argument(
        "--installed",
        action="store_true",
        help="skip the README's pip step (PYTHONPATH names the checkout)",
    )
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "ci.json")
    ap.add_argument("--logs", type=Path, default=Path("/tmp"))
    args = ap.parse_args()
    command = (
        CI_COMMAND if args.ci else (README_COMMAND if args.installed else INSTALL + README_COMMAND)
    )
    loops = []
    if not args.no_load:
        loops = [
            multiprocessing.Process(target=busy, daemon=True) for _ in range(os.cpu_count() or 1)
        ]
        for p in loops:
            p.start()
    runs = []
    try:
        for i in range(args.runs):
            log = args.logs / f"suite-under-load-{os.getpid()}-{i + 1}.log"
            runs.append(run_once(command, log) | {"busy_loops": len(loops)})
            print(json.dumps(runs[-1]), flush=True)
            if runs[-1]["rc"] != 0 or runs[-1]["passed"] == 0:
                break
    finally:
        for p in loops:
            p.kill()
            p.join()
    recorded = json.loads(args.out.read_text()) if args.out.exists() else {"runs": []}
    recorded["machine"] = {
        "cores": os.cpu_count(),
        "mem_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30),
    }
    recorded["runs"] = [*recorded.get("runs", []), *runs]
    if args.ci and runs:
        recorded["ci_wall_s"] = runs[-1]["wall_s"]
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(recorded, indent=2) + "\n")
    tmp.replace(args.out)
    ok = len(runs) == args.runs and all(r["rc"] == 0 and r["passed"] > 0 for r in runs)
    print(
        f"{'passed' if ok else 'FAILED'}: {len(runs)} run(s), walls {[r['wall_s'] for r in runs]} s"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
