"""A synthetic run for analysis tests: raw records and GPU snapshots as run_cell leaves them."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from servesweep.cluster import telemetry
from servesweep.config.load import load_experiment, load_experiment_file
from servesweep.config.matrix import cell_repeats
from servesweep.config.paths import RunPaths
from servesweep.core import gpufile
from servesweep.measure.records import write_record

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
CONFIG = REPO / "config" / "config.yaml"
REC_0523 = DATA / "records" / "bench_serving-0.5.23.jsonl"
REC_059 = DATA / "records" / "bench_serving-0.5.9.jsonl"
REC_BUILTIN = DATA / "records" / "builtin.jsonl"

# Multiplicative effects on latencies (throughputs are divided by them).
CHUNK = {8192: 1.0, 16384: 1.05}
CONC = {8: 1.0, 16: 1.8}
REPEAT = {1: 1.0, 2: 1.02, 3: 0.98}  # median factor over repeats is exactly 1
THROUGHPUTS = ("request_throughput", "input_throughput", "output_throughput", "total_throughput")


def template(path: Path) -> dict:
    return json.loads(path.read_text())


def request_details(n: int) -> dict:
    """Per-request details of n one-token requests agreeing with REC_0523's figures: every
    TTFT the same, at most its TTFT median and its E2E mean and median (a request's E2E is at
    least its TTFT), with the TTFT statistics they give (validation recomputes them)."""
    rec = template(REC_0523)
    keys = ("median_ttft_ms", "mean_e2e_latency_ms", "median_e2e_latency_ms")
    ttft = min(rec[k] for k in keys) / 1000
    stats = {f"{s}_ttft_ms": ttft * 1000 for s in ("mean", "median", "p90", "p95", "p99")}
    return {
        "input_lens": [16384] * n,
        "output_lens": [1] * n,
        "ttfts": [ttft] * n,
        "itls": [[]] * n,
        "generated_texts": ["x"] * n,
        "errors": [""] * n,
        **stats,
        "std_ttft_ms": 0.0,
    }


def detailed_template(root: Path) -> Path:
    """REC_0523 with its 40 requests' details (request-level resampling), written in root."""
    path = root / "bench_serving-0.5.23-details.jsonl"
    path.write_text(json.dumps({**template(REC_0523), **request_details(40)}) + "\n")
    return path


def experiment(*, workload_of: Path | None = None, **env: str):
    """The default experiment; `workload_of`: with the workload a template record was run with
    (collect_results checks each record against its cell's workload)."""
    if workload_of is None:
        return load_experiment_file(CONFIG, env)
    raw = yaml.safe_load(CONFIG.read_text())
    rec = template(workload_of)
    raw["workload"] |= {
        "input_len": rec["random_input_len"],
        "output_len": rec["random_output_len"],
        "num_requests": rec["completed"],
    }
    return load_experiment(raw, env)


def cell_record(cell, base: dict, backend: dict[str, float]) -> dict:
    s, c = cell.server.axes, cell.client.axes
    f = backend[s["moe_runner_backend"]] * CHUNK[s["chunked_prefill_size"]]
    f *= CONC[c["concurrency"]] * REPEAT[cell.repeat]
    rec = dict(base)
    for key, value in base.items():
        if key.endswith("_ms") and value is not None:
            rec[key] = value * f
        elif key in THROUGHPUTS:
            rec[key] = value / f
    # the same run f times slower: its clock and per-request times too (validation recomputes
    # throughputs and the TTFT median from them)
    rec["duration"] = base["duration"] * f
    if base.get("ttfts") is not None:
        rec["ttfts"] = [t * f for t in base["ttfts"]]
        rec["itls"] = [[x * f for x in itl] for itl in base["itls"]]
    rec["max_concurrency"] = c["concurrency"]
    return rec


def gpu_snapshot() -> list[dict]:
    idle = telemetry.parse_noheader(
        (DATA / "nvidia-smi-8gpu" / "query-idle-8gpu-noheader-nounits.csv").read_text()
    )
    load = telemetry.parse_noheader(
        (DATA / "nvidia-smi-8gpu" / "query-load-8gpu-noheader-nounits.csv").read_text()
    )
    meta = {"node": "local", "status": "ok", "detail": ""}
    return [{**row, **meta, "phase": "before"} for row in idle] + [
        {**row, **meta, "phase": "after"} for row in load
    ]


def make_run(root: Path, exp, *, base: Path = REC_0523, backend=None) -> RunPaths:
    backend = backend or {"marlin": 1.0, "flashinfer_mxfp4": 0.9}
    paths = RunPaths.for_run(exp, root / "results")
    snapshot = gpu_snapshot()
    rec = template(base)
    for cell in cell_repeats(exp):
        write_record(paths.raw(cell), cell_record(cell, rec, backend))
        gpufile.write_snapshot(paths.gpu(cell), snapshot)
    return paths


def collect(cells, paths: RunPaths, **kw):
    """results.collect_results over a run's files, as the workflow's job calls it:
    (results table, requests table); `kw`: its other arguments."""
    from servesweep.analysis.results import collect_results

    return collect_results(
        run_id=paths.root.name,
        cells=cells,
        raw=[paths.raw(c) for c in cells],
        gpu=[paths.gpu(c) for c in cells],
        **kw,
    )
