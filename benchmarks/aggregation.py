"""Item 4: results.csv + summary.json from 10,000 raw records (the rules' own scripts).

Writes a synthetic run in a scratch directory: N cell-repeats (10 server configs x N/50 client
configs x 5 repeats of the default experiment), each a bench_serving-compatible record with
per-request details (built by the builtin client's record code) and a GPU snapshot as this
machine writes it. Then runs `scripts/collect_results.py`, `scripts/scan_logs.py` and
`scripts/summarize.py` exactly as Snakemake would (a fresh interpreter each, the `snakemake`
object rebuilt with the rules' input/output names) and times each; `--profile` runs each once
more under cProfile and adds its top functions.

    python benchmarks/aggregation.py [--cell-repeats 10000] [--requests 40] [--profile]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from _common import REPO, add_common_args, log, scratch_dir, setup_logging, write_result

from servesweep.cluster import telemetry
from servesweep.cluster.transport import LocalTransport
from servesweep.config.load import load_experiment
from servesweep.config.matrix import cell_repeats
from servesweep.config.paths import RunPaths
from servesweep.measure.loadgen.metrics import RequestResult, build_record, record_line

GOAL_S = 10.0
SERVER_AXES = {
    "moe_runner_backend": ["marlin", "flashinfer_mxfp4"],
    "chunked_prefill_size": [4096, 8192, 12288, 16384, 20480],
}
REPEATS_PER_CELL = 5
RUN_ID = "aggregation-bench"
# Rule -> (script, inputs, outputs) with the names the rules use (rules/analysis.smk).
STAGES = ("collect_results", "scan_logs", "summarize")
# Runs one rule script the way Snakemake's `script:` does: a fresh interpreter, a `snakemake`
# object in the globals, cwd = the workflow's working directory; the job pays its imports, as
# in the workflow.
DRIVER = """\
import cProfile, json, runpy, sys, time
from types import SimpleNamespace


class IO(SimpleNamespace):
    def __getitem__(self, i):
        return list(vars(self).values())[i]


spec = json.loads(open(sys.argv[2]).read())
smk = SimpleNamespace(
    config=spec["config"],
    input=IO(**spec["input"]),
    output=IO(**spec["output"]),
    log=IO(**spec["log"]),
    params=IO(**spec.get("params", {})),
    wildcards=IO(),
    threads=1,
    rule=spec["rule"],
)
prof = cProfile.Profile() if spec["profile"] else None
start = time.perf_counter()
if prof:
    prof.enable()
try:
    runpy.run_path(sys.argv[1], init_globals={"snakemake": smk}, run_name="__main__")
finally:
    if prof:
        prof.disable()
        prof.dump_stats(spec["profile"])
    print(json.dumps({"body_s": time.perf_counter() - start}), file=sys.stderr)
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
    *, rng: np.random.Generator, cell: Any, requests: int, backend_factor: float
) -> str:
    """One raw record as the builtin client writes it (--output-details)."""
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
    return record_line(record, details=True)


def write_run(*, workdir: Path, config: dict[str, Any], requests: int) -> tuple[int, float]:
    """Raw records, GPU snapshots and server logs of a finished run; (cells, seconds)."""
    started = time.perf_counter()
    exp = load_experiment(config, {})
    paths = RunPaths(workdir / "results" / RUN_ID)
    before = telemetry.take_snapshot(transport=LocalTransport(), nodes=["local"], phase="before")
    after = telemetry.take_snapshot(transport=LocalTransport(), nodes=["local"], phase="after")
    template = workdir / "gpu-template.csv"
    telemetry.write_snapshot(template, before + after)
    gpu_bytes = template.read_bytes()
    rng = np.random.default_rng(7)
    cells = cell_repeats(exp)
    for cell in cells:
        factor = 0.95 if cell.server.axes.get("moe_runner_backend") != "marlin" else 1.0
        raw = paths.raw(cell)
        raw.parent.mkdir(parents=True, exist_ok=True)
        raw.write_text(record_text(rng=rng, cell=cell, requests=requests, backend_factor=factor))
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
    return len(cells), time.perf_counter() - started


def rule_io(
    stage: str, *, run: str, cells: list[Any], paths: RunPaths, workdir: Path
) -> dict[str, Any]:
    """The input/output names of rules/analysis.smk for one stage (paths relative to the
    workflow's working directory `workdir`)."""
    csv, requests = str(paths.results_csv), str(paths.requests_csv)
    if stage == "collect_results":
        ins = {"raw": [str(paths.raw(c)) for c in cells], "gpu": [str(paths.gpu(c)) for c in cells]}
        return {"input": ins, "output": {"csv": csv, "requests": requests}}
    found = RunPaths(workdir / paths.root).service_files()
    service = {k: [str(p.relative_to(workdir)) for p in v] for k, v in found.items()}
    if stage == "scan_logs":
        ins = {"csv": csv, "logs": service["logs"]}
        return {"input": ins, "output": {"json": str(paths.logscan_json)}}
    ins = {
        "csv": csv,
        "requests": requests,
        "logscan": str(paths.logscan_json),
        "warmup": service["warmup"],
    }
    return {"input": ins, "output": {"json": str(paths.summary_json)}}


def run_stage(
    stage: str, *, workdir: Path, config: dict[str, Any], io: dict[str, Any], profile: Path | None
) -> dict[str, Any]:
    spec = {
        "rule": stage,
        "config": config,
        **io,
        "log": {"log": f"results/{RUN_ID}/logs/{stage}.log"},
        "profile": str(profile) if profile else None,
    }
    if stage == "scan_logs":
        spec["params"] = {
            "evidence": config.get("evidence", {}),
            "service_root": f"results/{RUN_ID}/service",
        }
    script = REPO / "scripts" / f"{stage}.py"
    spec_file = workdir / f"{stage}.spec.json"
    spec_file.write_text(json.dumps(spec))
    start = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-c", DRIVER, str(script), str(spec_file)],
        cwd=workdir,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])},
    )
    wall = time.perf_counter() - start
    if res.returncode != 0:
        raise RuntimeError(f"{stage} exited {res.returncode}:\n{res.stderr[-3000:]}")
    body = json.loads(res.stderr.strip().splitlines()[-1])["body_s"]
    out: dict[str, Any] = {"stage": stage, "process_s": wall, "script_body_s": body}
    if profile:
        out["top_cumulative"] = top_functions(profile)
    return out


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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cell-repeats", type=int, default=10000)
    p.add_argument("--requests", type=int, default=40, help="per record (the default workload)")
    p.add_argument("--profile", action="store_true")
    add_common_args(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    args = parse_args(argv)
    config = experiment(args.cell_repeats, args.requests)
    stages = []
    with scratch_dir("aggregation", keep=args.keep_tmp) as tmp:
        n, gen_s = write_run(workdir=tmp, config=config, requests=args.requests)
        log.info("wrote %d raw records in %.1f s", n, gen_s)
        exp = load_experiment(config, {})
        cells = cell_repeats(exp)
        paths = RunPaths(Path("results") / RUN_ID)
        for stage in STAGES:
            io = rule_io(stage, run=f"results/{RUN_ID}", cells=cells, paths=paths, workdir=tmp)
            row = run_stage(stage, workdir=tmp, config=config, io=io, profile=None)
            if args.profile:  # a second, profiled run: cProfile's overhead stays out of the time
                prof = tmp / f"{stage}.prof"
                profiled = run_stage(stage, workdir=tmp, config=config, io=io, profile=prof)
                row["profiled_process_s"] = profiled["process_s"]
                row["top_cumulative"] = profiled["top_cumulative"]
            stages.append(row)
            log.info(
                "%-16s %6.2f s (script body %6.2f s)",
                stage,
                row["process_s"],
                row["script_body_s"],
            )
        csv = tmp / "results" / RUN_ID / "results.csv"
        rows_written = sum(1 for _ in csv.open()) - 1
        summary = json.loads((tmp / "results" / RUN_ID / "summary.json").read_text())
    total = sum(s["process_s"] for s in stages if s["stage"] in ("collect_results", "summarize"))
    result = {
        "params": {
            "cell_repeats": n,
            "requests_per_record": args.requests,
            "shape": "10 server configs x N/50 client configs x 5 repeats, default experiment",
            "stages": "scripts/collect_results.py, scripts/scan_logs.py, scripts/summarize.py, "
            "each in a fresh interpreter with its imports, as the workflow runs them",
        },
        "stages": stages,
        "results_csv_rows": rows_written,
        "summary_cells": len(summary.get("cells", [])),
        "summary_deltas": len(summary.get("deltas", [])),
        "csv_plus_summary_s": total,
        "goal_s": GOAL_S,
        "goal_met": total <= GOAL_S,
    }
    log.info("results.csv + summary.json: %.1f s (goal %.0f s)", total, GOAL_S)
    write_result("aggregation", result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
