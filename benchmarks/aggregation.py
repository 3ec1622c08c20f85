"""Item 4: results.csv + summary.json from 10,000 raw records (the workflow's own rules).

Writes a synthetic run in a scratch directory: N cell-repeats (10 server configs x N/50 client
configs x 5 repeats of the default experiment), each a raw record as run_cell writes it (the
builtin client's record code, per-request details, what the cell was measured with), a GPU
snapshot as this machine writes it, server logs and the image and preflight evidence. Then runs
`snakemake --cores N --allowed-rules collect_results scan_logs summarize` on it with the repo's
Snakefile: the rules' own input, output, params, threads and log, nothing copied here (N: this
machine's CPUs; collect_results and summarize fork a worker per core). Each stage's time is its job
process's wall time (a fresh interpreter with its imports, as in the workflow), taken by a
sitecustomize hook on the run's PYTHONPATH (HOOK), the median of `--repeats` runs (3; the runs
after the first force the three rules); `--profile` runs the stages once more under cProfile
and adds their top functions (of the job's own process, not its workers').

Checks (exit 1, each failure named): the goal, results.csv + summary.json <= 8 s for 10,000
records, a timing; sanity bounds: one results.csv row per record, a summary with
cells and deltas. `--smoke` (50 records of 5 requests, seconds) enforces the sanity bounds and
reports the goal without failing on it: at that size the figure is start-up and noise.

    python benchmarks/aggregation.py [--cell-repeats 10000] [--requests 40] [--cores N]
                                     [--profile] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
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

from servesweep.cluster import telemetry
from servesweep.cluster.transport import LocalTransport
from servesweep.config.load import load_experiment
from servesweep.config.matrix import cell_repeats
from servesweep.config.paths import RunPaths
from servesweep.core import gpufile
from servesweep.measure import provenance
from servesweep.measure.loadgen.metrics import RequestResult, build_record, record_line

GOAL_S = 8.0
SERVER_AXES = {
    "moe_runner_backend": ["marlin", "flashinfer_mxfp4"],
    "chunked_prefill_size": [4096, 8192, 12288, 16384, 20480],
}
REPEATS_PER_CELL = 5
RUN_ID = "aggregation-bench"
# The timed rules; Snakemake runs them (their own input, output, params and log), nothing else.
STAGES = ("collect_results", "scan_logs", "summarize")
SMOKE_CELL_REPEATS, SMOKE_REQUESTS = 50, 5
# A sitecustomize on the PYTHONPATH of the Snakemake run: every Python process it starts (the
# jobs' fresh interpreters) appends its argv and wall time to $SERVESWEEP_BENCH_TIMES, and, with
# $SERVESWEEP_BENCH_PROFILE set, its cProfile stats to that directory. The workflow runs as it
# is; only its processes are timed from the inside.
HOOK = """\
import atexit, json, os, sys, time
_t0 = time.time()
_out = os.environ.get("SERVESWEEP_BENCH_TIMES")
_prof_dir = os.environ.get("SERVESWEEP_BENCH_PROFILE")
_prof = None
if _prof_dir:
    import cProfile
    _prof = cProfile.Profile()
    _prof.enable()
def _done():
    if _prof is not None:
        _prof.disable()
        _prof.dump_stats(os.path.join(_prof_dir, f"{os.getpid()}.prof"))
    if _out:
        line = {"argv": sys.argv, "pid": os.getpid(), "start": _t0, "end": time.time()}
        with open(_out, "a") as fh:
            fh.write(json.dumps(line) + "\\n")
atexit.register(_done)
"""


def experiment(n: int, requests: int) -> dict[str, Any]:
    raw = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    servers = len(SERVER_AXES["moe_runner_backend"]) * len(SERVER_AXES["chunked_prefill_size"])
    raw["run_id"] = RUN_ID
    raw["matrix"] = {
        "server": SERVER_AXES,
        "client": {"concurrency": list(range(1, max(1, n // (servers * REPEATS_PER_CELL)) + 1))},
    }
    raw["repeats"] = REPEATS_PER_CELL
    raw["workload"]["num_requests"] = requests
    return raw


def record_text(
    *, rng: np.random.Generator, exp: Any, cell: Any, requests: int, backend_factor: float
) -> str:
    """One raw record as run_cell writes it: the builtin client's record (--output-details)
    with what the cell was measured with (collect_results refuses records without it)."""
    w = cell.client.workload
    results, start = [], 0.0
    base = 2.0 * backend_factor * (1 + 0.01 * w.concurrency)
    for _ in range(requests):
        ttft = float(rng.lognormal(np.log(base), 0.08))
        results.append(
            RequestResult(
                input_len=w.input_len,
                prompt_len=w.input_len,
                success=True,
                latency=ttft,
                ttft=ttft,
                output_len=w.output_len,
                generated_text=" the" * w.output_len,
                start_time=start,
            )
        )
        start += ttft / max(1, w.concurrency)
    settings = {
        "tag": cell.key,
        "backend": "sglang",
        "dataset_name": w.dataset,
        "request_rate": w.request_rate,
        "max_concurrency": w.concurrency,
        "sharegpt_output_len": None,
        "random_input_len": w.input_len,
        "random_output_len": w.output_len,
        "random_range_ratio": 1.0,
    }
    record = build_record(
        settings=settings,
        server_info={"version": "0.5.23-sim"},
        accept_length=None,
        duration_s=start + results[-1].latency,
        results=results,
    )
    record[provenance.KEY] = provenance.measured_with(exp, cell)
    return record_line(record, details=True)


def write_run(*, workdir: Path, config: dict[str, Any], requests: int) -> tuple[int, float]:
    """Raw records, GPU snapshots, server logs and the image and preflight evidence of a run
    whose cells are done; (cells, seconds)."""
    started = time.perf_counter()
    exp = load_experiment(config, {})
    paths = RunPaths(workdir / "results" / RUN_ID)
    before = telemetry.take_snapshot(transport=LocalTransport(), nodes=["local"], phase="before")
    after = telemetry.take_snapshot(transport=LocalTransport(), nodes=["local"], phase="after")
    template = workdir / "gpu-template.csv"
    gpufile.write_snapshot(template, before + after)
    gpu_bytes = template.read_bytes()
    rng = np.random.default_rng(7)
    cells = cell_repeats(exp)
    for cell in cells:
        factor = 0.95 if cell.server.axes.get("moe_runner_backend") != "marlin" else 1.0
        raw = paths.raw(cell)
        raw.parent.mkdir(parents=True, exist_ok=True)
        raw.write_text(
            record_text(rng=rng, exp=exp, cell=cell, requests=requests, backend_factor=factor)
        )
        gpu = paths.gpu(cell)
        gpu.parent.mkdir(parents=True, exist_ok=True)
        gpu.write_bytes(gpu_bytes)
    for spec in {c.server.id: c.server for c in cells}.values():
        service = paths.service(spec.id)
        service.mkdir(parents=True, exist_ok=True)
        (service / "local.log").write_text(
            "[2026-01-01 00:00:00] Load weight end.\n"
            "[2026-01-01 00:00:01] The server is fired up and ready to roll!\n"
        )
    for path in [*paths.builds(exp), paths.preflight]:  # the prerequisites of collect_results
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}\n")
    return len(cells), time.perf_counter() - started


def run_rules(
    *,
    workdir: Path,
    configfile: Path,
    target: Path,
    env: dict[str, str],
    forcerun: bool,
    cores: int,
) -> float:
    """`snakemake --cores CORES --allowed-rules STAGES TARGET` on the run in `workdir` with the
    repo's Snakefile and profile: the workflow's own jobs (collect_results and summarize use
    every core, their rules' threads). Returns its wall time."""
    argv = [snakemake_exe(), "-s", str(REPO / "Snakefile"), "-d", str(workdir)]
    argv += ["--configfile", str(configfile), "--cores", str(cores), "--allowed-rules", *STAGES]
    argv += ["--forcerun", *STAGES] if forcerun else []
    started = time.perf_counter()
    res = subprocess.run(
        [*argv, "--", str(target)], cwd=workdir, capture_output=True, text=True, env=env
    )
    wall = time.perf_counter() - started
    if res.returncode != 0:
        raise RuntimeError(f"snakemake exited {res.returncode}:\n{res.stderr[-3000:]}")
    return wall


def stage_times(times_file: Path, logs: Path) -> list[dict[str, Any]]:
    """Each stage's process wall time (the hook's line of the job whose script is the rule's)
    and script body time (its log's `job done in`)."""
    lines = [json.loads(line) for line in times_file.read_text().splitlines()]
    rows = []
    for stage in STAGES:
        procs = [x for x in lines if any(f".{stage}.py" in a for a in x["argv"][:1])]
        if len(procs) != 1:
            raise RuntimeError(f"{stage}: {len(procs)} job processes timed, expected 1")
        done = re.findall(r"job done in ([0-9.]+) s", (logs / f"{stage}.log").read_text())
        rows.append(
            {
                "stage": stage,
                "process_s": procs[0]["end"] - procs[0]["start"],
                "script_body_s": float(done[-1]) if done else None,
                "pid": procs[0]["pid"],
            }
        )
    return rows


def median_stages(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per stage: the median process and body time over the runs, and every run's."""
    rows = []
    for i, stage in enumerate(STAGES):
        per_run = [run[i] for run in runs]
        bodies = [r["script_body_s"] for r in per_run if r["script_body_s"] is not None]
        rows.append(
            {
                "stage": stage,
                "process_s": median([r["process_s"] for r in per_run]),
                "script_body_s": median(bodies) if bodies else None,
                "process_s_runs": [r["process_s"] for r in per_run],
                "pid": per_run[-1]["pid"],
            }
        )
    return rows


def top_functions(profile: Path, limit: int = 15) -> list[list[Any]]:
    """Functions of the package (and pandas/numpy calls they make) by cumulative time."""
    import pstats

    stats = pstats.Stats(str(profile)).stats  # type: ignore[attr-defined]
    rows = []
    for (path, line, func), (_cc, ncalls, tottime, cumtime, _callers) in stats.items():
        if "servesweep" in path or "/scripts/" in path:
            name = f"{path.split('src/')[-1]}:{line}({func})"
            rows.append([name, ncalls, round(tottime, 3), round(cumtime, 3)])
    rows.sort(key=lambda r: -r[3])
    return rows[:limit]


def top_own(profile: Path, limit: int = 5) -> dict[str, Any]:
    """Snakemake's own process: its profiled total and the functions that took the most time
    themselves (any module: Snakemake's cost is in Snakemake)."""
    import pstats

    stats = pstats.Stats(str(profile))
    rows = [
        [f"{path.split('site-packages/')[-1]}:{line}({func})", nc, round(tt, 3), round(ct, 3)]
        for (path, line, func), (_cc, nc, tt, ct, _callers) in stats.stats.items()  # type: ignore[attr-defined]
    ]
    rows.sort(key=lambda r: -r[2])
    return {"profiled_s": round(stats.total_tt, 2), "top_own": rows[:limit]}  # type: ignore[attr-defined]


def snakemake_process(times_file: Path) -> int | None:
    """The pid of the `snakemake` process itself in the hook's lines (not a job's)."""
    for line in times_file.read_text().splitlines():
        x = json.loads(line)
        if x["argv"] and Path(x["argv"][0]).name in ("snakemake", "__main__.py"):
            return int(x["pid"])
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cell-repeats", type=int, default=None, help="default 10000 (smoke: 50)")
    p.add_argument("--requests", type=int, default=None, help="per record (default 40; smoke: 5)")
    p.add_argument("--repeats", type=int, default=None, help="runs; medians (default 3, smoke 1)")
    p.add_argument(
        "--cores",
        type=int,
        default=os.cpu_count() or 1,
        help="snakemake --cores: the processes collect_results and summarize use (default: "
        "this machine's CPUs)",
    )
    p.add_argument("--profile", action="store_true")
    add_common_args(p)
    args = p.parse_args(argv)
    smoke = args.smoke
    args.cell_repeats = args.cell_repeats or (SMOKE_CELL_REPEATS if smoke else 10000)
    args.requests = args.requests or (SMOKE_REQUESTS if smoke else 40)
    args.repeats = args.repeats or (1 if smoke else 3)
    return args


def checks(result: dict[str, Any], *, cells: int) -> list[Check]:
    """The goal (a timing) and the sanity bounds: every record a row, every cell summarized."""
    total, rows = result["csv_plus_summary_s"], result["results_csv_rows"]
    return [
        Check(
            f"results.csv + summary.json <= {GOAL_S:g} s (the goal at 10,000 records)",
            total <= GOAL_S,
            f"{total:.2f} s for {cells:,} records",
            timing=True,
        ),
        Check("results.csv has one row per record", rows == cells, f"{rows} rows, {cells} records"),
        Check(
            "summary.json has cells and deltas",
            result["summary_cells"] > 0 and result["summary_deltas"] > 0,
            f"{result['summary_cells']} cells, {result['summary_deltas']} deltas",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    args = parse_args(argv)
    config = experiment(args.cell_repeats, args.requests)
    with scratch_dir("aggregation", keep=args.keep_tmp) as tmp:
        n, gen_s = write_run(workdir=tmp, config=config, requests=args.requests)
        log.info("wrote %d raw records in %.1f s", n, gen_s)
        configfile = tmp / "config.yaml"
        configfile.write_text(yaml.safe_dump(config))
        hook = tmp / "hook"
        hook.mkdir()
        (hook / "sitecustomize.py").write_text(HOOK)
        paths = RunPaths(tmp / "results" / RUN_ID)
        target = RunPaths(Path("results") / RUN_ID).summary_json  # as the workflow names it
        pythonpath = [str(hook), str(REPO / "src"), os.environ.get("PYTHONPATH", "")]
        env = workflow_env(PYTHONPATH=os.pathsep.join(p for p in pythonpath if p))
        runs, snakemake_s = [], []
        snakemake_profile = None
        for k in range(args.repeats):  # the first run makes the outputs; the next force them
            times = tmp / f"times.{k}.jsonl"
            env["SERVESWEEP_BENCH_TIMES"] = str(times)
            snakemake_s.append(
                run_rules(
                    workdir=tmp,
                    configfile=configfile,
                    target=target,
                    env=env,
                    forcerun=k > 0,
                    cores=args.cores,
                )
            )
            runs.append(stage_times(times, paths.logs))
        stages = median_stages(runs)
        if args.profile:  # a second, profiled run: cProfile's overhead stays out of the time
            prof_dir, times_p = tmp / "profiles", tmp / "times-profiled.jsonl"
            prof_dir.mkdir()
            env_p = {**env, "SERVESWEEP_BENCH_TIMES": str(times_p)}
            env_p["SERVESWEEP_BENCH_PROFILE"] = str(prof_dir)
            run_rules(
                workdir=tmp,
                configfile=configfile,
                target=target,
                env=env_p,
                forcerun=True,
                cores=args.cores,
            )
            for row, profiled in zip(stages, stage_times(times_p, paths.logs), strict=True):
                row["profiled_process_s"] = profiled["process_s"]
                row["top_cumulative"] = top_functions(prof_dir / f"{profiled['pid']}.prof")
            if (pid := snakemake_process(times_p)) is not None:
                snakemake_profile = top_own(prof_dir / f"{pid}.prof")
        for row in stages:
            log.info(
                "%-16s %6.2f s (script body %s s)",
                row["stage"],
                row["process_s"],
                row["script_body_s"],
            )
        rows_written = sum(1 for _ in paths.results_csv.open()) - 1
        summary = json.loads(paths.summary_json.read_text())
    total = sum(s["process_s"] for s in stages if s["stage"] in ("collect_results", "summarize"))
    result = {
        "params": {
            "cell_repeats": n,
            "requests_per_record": args.requests,
            "repeats": args.repeats,
            "cores": args.cores,
            "smoke": args.smoke,
            "shape": "10 server configs x N/50 client configs x 5 repeats, default experiment",
            "stages": "rules collect_results, scan_logs, summarize run by `snakemake "
            f"--allowed-rules --cores {args.cores}` on the repo's Snakefile (collect_results "
            "and summarize fork one worker per core); each stage's time is its job process's "
            "(a fresh interpreter with its imports, as the workflow runs them), median of "
            f"{args.repeats} run(s)",
        },
        "stages": stages,
        # The whole `snakemake` call (its DAG, job starts and the three jobs), and under
        # --profile where its own process spent its time.
        "snakemake_s": median(snakemake_s),
        "snakemake_profile": snakemake_profile,
        "results_csv_rows": rows_written,
        "summary_cells": len(summary.get("cells", [])),
        "summary_deltas": len(summary.get("deltas", [])),
        "csv_plus_summary_s": total,
        "goal_s": GOAL_S,
        "goal_met": total <= GOAL_S,
    }
    found = checks(result, cells=n)
    result["checks"] = check_rows(found, smoke=args.smoke)
    log.info("results.csv + summary.json: %.1f s (goal %.0f s)", total, GOAL_S)
    write_result("aggregation", result, args.out, smoke=args.smoke)
    return verdict(found, smoke=args.smoke)


if __name__ == "__main__":
    sys.exit(main())
