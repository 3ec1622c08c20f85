"""Item 5: a large matrix (10,000 cell-repeats by default) on the zero-cost sim runs through.

`snakemake --cores 1 all` with the repo's workflow profile (its scheduler) on the default
experiment reshaped to N cell-repeats (10 server configs x N/50 client configs x 5 repeats),
the sim at zero cost and one 16-token request per cell, in a scratch directory. Reports whether
it completed, the wall time, the time per cell early and late in the run (a scheduler that
slows down with the number of pending jobs shows up as a growing gap), and where a cell's time
goes. `--timeout S` stops the run (SIGINT, as Ctrl-C: the running job ends, servers are stopped)
and extrapolates from the cells done. `--workdir DIR` keeps the run in DIR: run again with the
same DIR and Snakemake reruns only the missing cells (figures then cover this invocation; the
total counts every raw file).

    python benchmarks/large_run.py [--cell-repeats 10000] [--timeout 0] [--workdir DIR] [--smoke]

Checks (exit 1, each failure named): sanity, cells were done; goal, every cell-repeat complete
with results.csv, summary.json and manifest.json (a run stopped by --timeout has not met it).
Neither is a timing: `--smoke` (8 cell-repeats of 2 server configs) enforces both.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from _common import (
    FALLBACK_SCALE,
    REPO,
    ZERO_COST_SCALE,
    Check,
    add_common_args,
    check_rows,
    free_port,
    log,
    median,
    proc_cpu_s,
    provenance,
    scratch_dir,
    setup_logging,
    snakemake_exe,
    time_scale_note,
    verdict,
    workflow_env,
    write_result,
)

from servesweep.config.load import load_experiment
from servesweep.config.paths import RunPaths
from servesweep.core.errors import ConfigError
from servesweep.core.events import read_events
from servesweep.serving.servers import shutdown

SERVER_AXES = {
    "moe_runner_backend": ["marlin", "flashinfer_mxfp4"],
    "chunked_prefill_size": [4096, 8192, 12288, 16384, 20480],
}
REPEATS_PER_CELL = 5
RUN_ID = "large-run-bench"
# --smoke: 8 cell-repeats of 2 server configs (seconds); the goal (the run completes) is no
# timing, so a smoke run fails on it too.
SMOKE_AXES = {"moe_runner_backend": ["marlin", "flashinfer_mxfp4"], "chunked_prefill_size": [8192]}
SMOKE_CELL_REPEATS = 8
TERM_GRACE_S = 120.0  # a running cell finishes well within this
SEGMENTS_FILE = "segments.json"  # in --workdir: one entry per invocation (record_segment)
SEGMENT_KEYS = (
    "completed",
    "wall_s",
    "cells_done",
    "cell_cycle_median_s",
    "snakemake_cpu_per_cell_s",
)


def experiment(n: int, *, smoke: bool = False) -> dict[str, Any]:
    """The default experiment with ~n cell-repeats, zero-cost sim, one tiny request per cell
    (`smoke`: 2 server configs x N/4 client configs x 2 repeats)."""
    raw = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    axes, repeats = (SMOKE_AXES, 2) if smoke else (SERVER_AXES, REPEATS_PER_CELL)
    servers = len(axes["moe_runner_backend"]) * len(axes["chunked_prefill_size"])
    clients = max(1, n // (servers * repeats))
    raw["run_id"] = RUN_ID
    raw["engine"]["port"] = free_port()
    raw["engine"]["dist_init_port"] = free_port()
    raw["engine"]["ready_timeout_s"] = 60
    raw["engine"]["sim"].update({"time_scale": ZERO_COST_SCALE, "startup_s": 0})
    raw["matrix"] = {"server": axes, "client": {"concurrency": list(range(1, clients + 1))}}
    raw["repeats"] = repeats
    raw["workload"].update({"input_len": 16, "output_len": 1, "num_requests": 1})
    try:
        load_experiment(raw, {})
    except ConfigError:  # no zero-cost mode in this version's config yet
        raw["engine"]["sim"]["time_scale"] = FALLBACK_SCALE
        load_experiment(raw, {})
    return raw


def stamp(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def progress(run_dir: Path, *, started: float, ended: float, n: int) -> dict[str, Any]:
    """Cell timing of this invocation from orchestrator.log: totals, early vs late gaps,
    extrapolation to the cells still missing."""
    events = [e for e in read_events(run_dir / "orchestrator.log") if stamp(e[0]) >= started]
    total = sum(1 for _ in (run_dir / "raw").rglob("*.jsonl")) if (run_dir / "raw").is_dir() else 0
    starts = [stamp(t) for t, e, _ in events if e == "cell-start"]
    done = [(stamp(t), f) for t, e, f in events if e == "cell-done"]
    if not done:
        return {"cells_done": 0, "cells_done_total": total}
    ends = [t for t, _ in done]
    cycle = [b - a for a, b in zip(ends, ends[1:], strict=False)]  # one cell, end to end
    tenth = max(1, len(cycle) // 10)
    in_cell = [float(f["seconds"]) for _, f in done]
    client = [float(f["client_seconds"]) for _, f in done]
    gaps = [s - d for s, d in zip(starts[1:], ends[:-1], strict=False)]
    late = median(cycle[-tenth:]) if cycle else None
    return {
        "cells_done": len(done),
        "cells_done_total": total,
        "server_starts": sum(1 for _, e, _ in events if e == "start"),
        "before_first_cell_s": starts[0] - started if starts else None,
        "cells_span_s": ends[-1] - starts[0],
        "cell_cycle_median_s": median(cycle) if cycle else None,
        "cell_cycle_first_tenth_s": median(cycle[:tenth]) if cycle else None,
        "cell_cycle_last_tenth_s": late,
        "in_cell_median_s": median(in_cell),
        "client_median_s": median(client),
        "between_cells_median_s": median(gaps) if gaps else None,
        "after_last_cell_s": ended - ends[-1],
        "projected_cells_s": (
            (starts[0] - started) + (ends[-1] - starts[0]) + late * (n - total)
            if late is not None
            else None
        ),
    }


def stop(proc: subprocess.Popen[bytes]) -> bool:
    """SIGINT to Snakemake's process group, as a terminal's Ctrl-C sends it (the running cell
    ends, onerror stops servers); True if Snakemake then hung and was killed.

    Not SIGTERM: Snakemake 9's SIGTERM handler takes the job scheduler's (non-reentrant) lock;
    when the signal lands while the main thread holds it selecting jobs, which with thousands
    of pending jobs is most of the time, the handler waits for itself forever (README).
    """
    log.info("timeout: SIGINT to snakemake's process group (the running job ends, servers stop)")
    os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=TERM_GRACE_S)
        return False
    except subprocess.TimeoutExpired:
        log.info("snakemake still running %.0f s after SIGINT: SIGKILL", TERM_GRACE_S)
        proc.kill()
        proc.wait()
        return True


def record_segment(workdir: Path, result: dict[str, Any]) -> list[dict[str, Any]]:
    """Append one invocation's figures to `<workdir>/segments.json` (a resumed run is several
    invocations, maybe of different code); every segment so far, oldest first."""
    path = workdir / SEGMENTS_FILE
    segments = json.loads(path.read_text()) if path.exists() else []
    made = {k: result["provenance"][k] for k in ("measured_at", "git_sha")}
    segments.append({**{key: result.get(key) for key in SEGMENT_KEYS}, **made})
    path.write_text(json.dumps(segments, indent=2) + "\n")
    return segments


def run_dir_for(args: argparse.Namespace) -> contextlib.AbstractContextManager[Path]:
    """--workdir (created, always kept) or a scratch directory."""
    if args.workdir is None:
        return scratch_dir("large", keep=args.keep_tmp)
    path = Path(args.workdir).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return contextlib.nullcontext(path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cell-repeats", type=int, default=None, help="default 10000 (smoke: 8)")
    p.add_argument("--timeout", type=float, default=0, help="stop after S seconds (0: never)")
    p.add_argument("--workflow", default=str(REPO), help="directory with the Snakefile to run")
    p.add_argument("--workdir", default=None, help="keep (and resume) the run in this directory")
    add_common_args(p)
    args = p.parse_args(argv)
    args.cell_repeats = args.cell_repeats or (SMOKE_CELL_REPEATS if args.smoke else 10000)
    return args


def checks(result: dict[str, Any]) -> list[Check]:
    """The goal (the run completes: no timing) and the sanity bound: cells were done."""
    state = "stopped by --timeout" if result["timed_out"] else f"exit {result['returncode']}"
    total = result.get("cells_done_total", 0)
    return [
        Check(
            "cells done in this invocation",
            result.get("cells_done", 0) > 0 or total >= result["params"]["cell_repeats"],
            f"{result.get('cells_done', 0)} now, {total} raw files in all",
        ),
        Check(
            f"all {result['params']['cell_repeats']:,} cell-repeats complete",
            result["completed"],
            f"{state}; {total} raw files; results.csv, summary.json, manifest.json "
            + ("written" if result["completed"] else "missing or stale"),
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    args = parse_args(argv)
    # Started in the background by a non-interactive shell, this process inherits SIGINT as
    # ignored, and so would Snakemake and its jobs: the stop() below would then do nothing.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    exe = snakemake_exe()
    env = workflow_env()
    profile = yaml.safe_load((REPO / "profiles" / "default" / "config.yaml").read_text())
    with run_dir_for(args) as tmp:
        config = tmp / "exp.yaml"
        if config.exists():  # resuming: the same experiment (ports included) or cells rerun
            raw = yaml.safe_load(config.read_text())
            log.info("resuming the run in %s", tmp)
        else:
            raw = experiment(args.cell_repeats, smoke=args.smoke)
            config.write_text(yaml.safe_dump(raw, sort_keys=False))
        workdir = tmp / "ws"
        argv_s = [exe, "-s", str(Path(args.workflow) / "Snakefile"), "-d", str(workdir)]
        argv_s += ["--configfile", str(config), "--cores", "1", "all"]
        log.info("running %s", " ".join(argv_s))
        started = time.time()
        timed_out = hung = False
        with open(tmp / "snakemake.log", "a") as fh:
            proc = subprocess.Popen(  # its own process group, as a shell's foreground job
                argv_s, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
            )
            deadline = started + args.timeout if args.timeout else None
            snakemake_cpu = 0.0
            while proc.poll() is None:  # Snakemake's own CPU (not its jobs'), sampled
                with contextlib.suppress(OSError):
                    snakemake_cpu = proc_cpu_s(proc.pid)
                if deadline is not None and time.time() > deadline:
                    timed_out = True
                    hung = stop(proc)
                    break
                time.sleep(1.0)
        ended = time.time()
        if hung:  # onerror never ran: stop the server the run left up
            with contextlib.chdir(workdir):
                exp = load_experiment(raw, {})
                shutdown(exp, RunPaths.for_run(exp), reason="benchmark stopped a hung snakemake")
        run_dir = workdir / "results" / RUN_ID
        figures = progress(run_dir, started=started, ended=ended, n=args.cell_repeats)
        outputs = [run_dir / name for name in ("results.csv", "summary.json", "manifest.json")]
        completed = proc.returncode == 0 and all(p.exists() for p in outputs)
        if proc.returncode != 0 and not timed_out:
            tail = (tmp / "snakemake.log").read_text()[-3000:]
            log.info("snakemake exited %d:\n%s", proc.returncode, tail)
    result = {
        "params": {
            "cell_repeats": args.cell_repeats,
            "shape": "10 server configs x N/50 client configs x 5 repeats, default experiment"
            if not args.smoke
            else "smoke: 2 server configs x N/4 client configs x 2 repeats, default experiment",
            "smoke": args.smoke,
            "workload": "1 request of 16 input tokens, 1 output token per cell",
            "sim_time_scale": raw["engine"]["sim"]["time_scale"],
            "sim_note": time_scale_note(raw["engine"]["sim"]["time_scale"]),
            "scheduler": profile.get("scheduler", "ilp (Snakemake default)"),
            "timeout_s": args.timeout or None,
            "command": "snakemake --cores 1 all",
            "workflow": args.workflow,
            "workdir": args.workdir,
        },
        "completed": completed,
        "timed_out": timed_out,
        "hung_after_sigint": hung,
        "returncode": proc.returncode,
        "wall_s": ended - started,
        "snakemake_cpu_s": snakemake_cpu,
        "snakemake_cpu_per_cell_s": (
            snakemake_cpu / figures["cells_done"] if figures.get("cells_done") else None
        ),
        **figures,
    }
    log.info("completed=%s wall %.0f s, %s", completed, ended - started, figures)
    if args.workdir:
        result["segments"] = record_segment(
            Path(args.workdir).resolve(), {**result, "provenance": provenance()}
        )
    found = checks(result)
    result["checks"] = check_rows(found, smoke=args.smoke)
    write_result("large_run", result, args.out, smoke=args.smoke)
    return verdict(found, smoke=args.smoke)


if __name__ == "__main__":
    sys.exit(main())
