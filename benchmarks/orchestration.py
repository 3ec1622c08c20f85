"""Item 3: orchestration overhead of `snakemake --cores 1 all` on the default matrix.

Runs the embedded default experiment (fresh ports, scratch directory) and divides the wall
time of the whole `snakemake --cores 1 all` by the time spent where it must be spent: the sum
of server-ready times (`ready ... seconds=`) and client times (`cell-done ... client_seconds=`)
from orchestrator.log. Splits the rest into: before the first cell, between cells, inside
cells around the client, after the last cell (analysis jobs, from their output files' times),
and measures what one job's Python process costs to start.

    python benchmarks/orchestration.py [--config FILE] [--smoke]

Checks (exit 1, each failure named): sanity, cells ran and servers started, wall >= ready +
client (a ratio below 1 is an accounting error); goal (a timing), ratio <= 1.1. `--smoke` (2
cells, no import probes) enforces the sanity bounds and reports the ratio without failing on
it: at 2 cells the workflow's fixed cost dominates.
"""

from __future__ import annotations

import argparse
import datetime as dt
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from _common import (
    REPO,
    Check,
    add_common_args,
    check_rows,
    log,
    median,
    scratch_dir,
    setup_logging,
    snakemake_exe,
    verdict,
    workflow_env,
    write_result,
)

from servesweep.core.events import read_events
from tests.helpers import experiment_file

GOAL_RATIO = 1.10
# --smoke: 2 server configs x 1 client config x 1 repeat of 8 short requests (seconds of
# cells, the rest is the workflow's fixed cost); the ratio is reported, not enforced (a timing).
SMOKE_CHANGES: dict[str, Any] = {
    "matrix": {
        "server": {
            "moe_runner_backend": ["marlin", "flashinfer_mxfp4"],
            "chunked_prefill_size": [8192],
        },
        "client": {"concurrency": [4]},
    },
    "workload": {"num_requests": 8, "input_len": 256},
    "repeats": 1,
}
RUN_ID = "orchestration-bench"
# What a job's process imports before its body runs: Snakemake's `script:` preamble, then the
# module of its job function (scripts/<rule>.py imports it by name).
IMPORTS = {
    "python -c pass": "pass",
    "snakemake `script:` preamble (snakemake.script)": "import snakemake.script",
    "cell jobs (build_images, preflight, run_cell)": "import servesweep.workflow.jobs",
    "table jobs (servesweep.workflow.analysisjobs)": "import servesweep.workflow.analysisjobs",
    "plot jobs (servesweep.workflow.plotjobs)": "import servesweep.workflow.plotjobs",
    "builtin client (its own process)": "import servesweep.measure.loadgen.builtin",
}


def stamp(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def import_costs(repeats: int = 3) -> dict[str, float]:
    """Median wall seconds of a fresh interpreter importing what a job's script imports."""
    out = {}
    for label, code in IMPORTS.items():
        walls = []
        for _ in range(repeats):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
            walls.append(time.perf_counter() - start)
        out[label] = median(walls)
    return out


def analysis_jobs(run_dir: Path, *, after: float) -> list[dict[str, Any]]:
    """Output files written after the last cell, in order, with the time since the previous."""
    skip = {"logs", "service", "raw", "gpu", "bench"}
    files = [
        p
        for p in run_dir.rglob("*")
        if p.is_file()
        and p.stat().st_mtime > after
        and not skip & set(p.relative_to(run_dir).parts)
        and p.name != "orchestrator.log"
    ]
    files.sort(key=lambda p: p.stat().st_mtime)
    jobs, previous = [], after
    for path in files:
        mtime = path.stat().st_mtime
        jobs.append({"output": str(path.relative_to(run_dir)), "seconds": mtime - previous})
        previous = mtime
    return jobs


def breakdown(*, run_dir: Path, started: float, ended: float) -> dict[str, Any]:
    """Where the wall time of one workflow run went, from orchestrator.log and file times."""
    events = read_events(run_dir / "orchestrator.log")
    ready = sum(float(f["seconds"]) for _, e, f in events if e == "ready")
    client = sum(float(f["client_seconds"]) for _, e, f in events if e == "cell-done")
    cells = sum(float(f["seconds"]) for _, e, f in events if e == "cell-done")
    starts = [stamp(t) for t, e, _ in events if e == "cell-start"]
    dones = [stamp(t) for t, e, _ in events if e == "cell-done"]
    stops = [stamp(t) for t, e, _ in events if e == "stop"]
    gaps = [s - d for s, d in zip(starts[1:], dones[:-1], strict=False)]
    wall = ended - started
    jobs = analysis_jobs(run_dir, after=dones[-1]) if dones else []
    last_output = dones[-1] + sum(j["seconds"] for j in jobs) if dones else None
    return {
        "wall_s": wall,
        "ready_s": ready,
        "client_s": client,
        "ratio": wall / (ready + client) if ready + client else None,
        "cells": len(dones),
        "server_starts": sum(1 for _, e, _ in events if e == "start"),
        "overhead_s": {
            "before_first_cell": (starts[0] - started) if starts else None,
            "between_cells": sum(gaps),
            "between_cells_median": median(gaps) if gaps else None,
            "inside_cells_besides_client_and_ready": cells - client - ready,
            "after_last_cell": (ended - dones[-1]) if dones else None,
            "  analysis jobs": sum(j["seconds"] for j in jobs),
            "  of which plots": sum(j["seconds"] for j in jobs if j["output"].startswith("plots")),
            "  final server stop and exit": (ended - last_output) if last_output else None,
        },
        "final_stop_event_after_last_output_s": (
            stops[-1] - last_output if stops and last_output else None
        ),
        "after_last_cell_outputs": jobs,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--config", default=None, help="experiment YAML (default: the embedded one)")
    p.add_argument("--no-imports", action="store_true", help="skip the import-cost probes")
    add_common_args(p)
    if p.parse_known_args(argv)[0].smoke:  # smoke: no import probes; a flag given still wins
        p.set_defaults(no_imports=True)
    return p.parse_args(argv)


def checks(figures: dict[str, Any]) -> list[Check]:
    """The goal (a timing) and the sanity bounds: cells ran, servers started, and the wall
    time covers the time it is divided by (a ratio below 1 is an accounting error)."""
    ratio = figures["ratio"]
    return [
        Check(
            "cells ran and servers started",
            figures["cells"] > 0 and figures["server_starts"] > 0,
            f"{figures['cells']} cells, {figures['server_starts']} server starts",
        ),
        Check(
            "wall time >= server-ready + client time",
            ratio is not None and ratio >= 1.0,
            f"ratio {ratio:.2f}" if ratio is not None else "no ready or client time",
        ),
        Check(
            f"wall / (server ready + client) <= {GOAL_RATIO}",
            ratio is not None and ratio <= GOAL_RATIO,
            f"{ratio:.2f}" if ratio is not None else "-",
            timing=True,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    args = parse_args(argv)
    exe = snakemake_exe()
    env = workflow_env()
    with scratch_dir("orchestration", keep=args.keep_tmp) as tmp:
        changes: dict[str, Any] = {"run_id": RUN_ID}
        if args.config:
            changes = {**yaml.safe_load(Path(args.config).read_text()), **changes}
        if args.smoke:
            changes = {**changes, **SMOKE_CHANGES}
        config = experiment_file(tmp, changes)
        workdir = tmp / "ws"
        argv_s = [exe, "-s", str(REPO / "Snakefile"), "-d", str(workdir)]
        argv_s += ["--configfile", str(config), "--cores", "1", "all"]
        log.info("running %s", " ".join(argv_s))
        started = time.time()
        with open(tmp / "snakemake.log", "w") as fh:
            res = subprocess.run(argv_s, env=env, stdout=fh, stderr=subprocess.STDOUT)
        ended = time.time()
        if res.returncode != 0:
            tail = (tmp / "snakemake.log").read_text()[-3000:]
            raise SystemExit(f"snakemake exited {res.returncode}:\n{tail}")
        figures = breakdown(run_dir=workdir / "results" / RUN_ID, started=started, ended=ended)
    figures["goal_ratio"] = GOAL_RATIO
    figures["goal_met"] = figures["ratio"] is not None and figures["ratio"] <= GOAL_RATIO
    if not args.no_imports:
        figures["process_start_s"] = import_costs()
    log.info(
        "wall %.1f s = ready %.1f + client %.1f + overhead; ratio %.2f (goal %.2f)",
        figures["wall_s"],
        figures["ready_s"],
        figures["client_s"],
        figures["ratio"],
        GOAL_RATIO,
    )
    for key, value in figures["overhead_s"].items():
        log.info("  %-40s %s", key, f"{value:.1f} s" if value is not None else "-")
    result = {
        "params": {
            "experiment": args.config or "config/config.yaml (embedded default, fresh ports)",
            "command": "snakemake --cores 1 all",
            "smoke": args.smoke,
        },
        **figures,
    }
    found = checks(figures)
    result["checks"] = check_rows(found, smoke=args.smoke)
    write_result("orchestration", result, args.out, smoke=args.smoke)
    return verdict(found, smoke=args.smoke)


if __name__ == "__main__":
    sys.exit(main())
