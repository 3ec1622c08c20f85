"""Kill one role of a running server set mid-cell, for the fault runs of the PD rehearsal
(docs/rehearsal.md). Waits until run RUN's orchestrator.log shows a `cell-start`, waits DELAY
seconds more, then SIGKILLs the process group of ROLE (prefill, decode or router) found in the
run's server state (service/current.json, or the service `servesweep up` started:
results/.services/<fingerprint>.json; each rank's handle is its setsid group's pid).

    python3 tools/rehearsal/kill_role.py RESULTS_DIR RUN ROLE [--delay 3] [--timeout 400]

Prints one line of what it did; exits 1 if it found nothing to kill in time."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("results")
    p.add_argument("run")
    p.add_argument("role", choices=["prefill", "decode", "router"])
    p.add_argument("--delay", type=float, default=3.0)
    p.add_argument("--timeout", type=float, default=400.0)
    a = p.parse_args()
    run = Path(a.results, a.run)
    deadline = time.monotonic() + a.timeout
    log = run / "orchestrator.log"
    while time.monotonic() < deadline:
        text = log.read_text() if log.exists() else ""
        state = _state(run)
        if " cell-start " in text and state is not None:
            break
        time.sleep(0.5)
    else:
        print(f"kill_role: no cell-start in {log} within {a.timeout:.0f}s", flush=True)
        return 1
    time.sleep(a.delay)
    ranks = [r for r in json.loads(state.read_text())["ranks"] if r["role"] == a.role]
    if not ranks:
        print(f"kill_role: no {a.role} rank in {state}", flush=True)
        return 1
    for rank in ranks:
        pgid = int(rank["handle"])
        os.killpg(pgid, signal.SIGKILL)
        stamp = time.strftime("%H:%M:%S", time.gmtime())
        where = f"{a.role} on {rank['node']} (group {pgid})"
        print(f"kill_role: {stamp}Z SIGKILL to {where}", flush=True)
    return 0


def _state(run: Path) -> Path | None:
    """The run's own server state, else the one service's (the run reuses it)."""
    own = run / "service" / "current.json"
    if own.exists():
        return own
    services = [
        p for p in sorted((run.parent / ".services").glob("*.json")) if "ranks" in p.read_text()
    ]
    return services[0] if len(services) == 1 else None


if __name__ == "__main__":
    sys.exit(main())
