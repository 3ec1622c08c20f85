# Load + validate config, apply env narrowing, expand the matrix, constrain wildcards, helpers.
import os
import sys
from pathlib import Path

from servesweep.config import (
    axis_names,
    cell_repeats,
    load_experiment,
    RunPaths,
    server_specs,
)
from servesweep.compare import run_inputs
from servesweep.engines import check_experiment
from servesweep.errors import ConfigError
from servesweep.servers import shutdown

if not workflow.overwrite_configfiles:
    workflow.configfile(os.path.join(workflow.basedir, "config", "config.yaml"))

try:
    EXP = load_experiment(config, os.environ)
    check_experiment(EXP, server_specs(EXP))
except ConfigError as exc:
    sys.exit(f"servesweep: ConfigError: {exc}")

if workflow.global_resources.get("gpu_server") != 1:
    sys.exit(
        "servesweep: resources gpu_server=1 is missing (did --resources replace the "
        "workflow profile's list?); add gpu_server=1 to --resources"
    )

PATHS = RunPaths.for_run(EXP)
RUN_DIR = str(PATHS.root)
CELLS = {cell.key: cell for cell in cell_repeats(EXP)}
# The set of cells as a param: rules over all cells rerun when it changes (no `input` trigger).
CELL_KEYS = sorted(CELLS)
PLOT_METRICS = ["ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "input_tps"]
RESULTS_ROOT = str(PATHS.root.parent)
PLOT_X = next(iter(axis_names(EXP)[1]), None) if not EXP.cases else None


wildcard_constraints:
    server=r"[^/]+",
    client=r"[^/]+",
    repeat=r"\d+",
    node=r"[^/]+",
    metric=r"[a-z0-9_]+",
    run_a=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    run_b=r"[A-Za-z0-9][A-Za-z0-9._-]*",


def cell_of(wildcards):
    return CELLS[f"{wildcards.server}/{wildcards.client}/r{wildcards.repeat}"]


def cell_fingerprint(wildcards):
    return cell_of(wildcards).server.fingerprint


def cell_workload(wildcards):
    return cell_of(wildcards).client.workload.model_dump_json()


def cell_priority(wildcards):
    return cell_of(wildcards).server.priority


# Computed once: several rules list every cell's files (10k cells: ~1 s per listing).
RAW_FILES = [str(PATHS.raw(cell)) for cell in CELLS.values()]
GPU_FILES = [str(PATHS.gpu(cell)) for cell in CELLS.values()]


def all_raw():
    return RAW_FILES


def all_gpu():
    return GPU_FILES


def all_builds():
    if EXP.runtime.kind != "docker":
        return []
    return [f"{RUN_DIR}/build/{node}.json" for node in EXP.cluster.nodes]


def cell_prerequisites(wildcards):
    """Image evidence and preflight before a cell runs; a finished cell does not depend on
    them (re-validating an image must not rerun finished cells)."""
    if os.path.exists(PATHS.raw(cell_of(wildcards))):
        return []
    return [*all_builds(), f"{RUN_DIR}/preflight.json"]


def all_plots():
    plots = [f"{RUN_DIR}/plots/delta_{m}.png" for m in PLOT_METRICS]
    if PLOT_X is not None:
        plots += [f"{RUN_DIR}/plots/{m}_vs_{PLOT_X}.png" for m in PLOT_METRICS]
    return plots


def all_case_tables():
    return [f"{RUN_DIR}/cases.md", f"{RUN_DIR}/cases.html"] if EXP.cases else []


def compare_inputs(wildcards):
    """results.csv (+ raw files where present) of runs A and B of a comparison."""
    files = {}
    for side, run in (("a", wildcards.run_a), ("b", wildcards.run_b)):
        current = all_raw() if run == EXP.run_id else None
        found = run_inputs(run_dir=Path(RESULTS_ROOT) / run, current_raw=current)
        files[f"csv_{side}"] = found["csv"]
        files[f"raw_{side}"] = found["raw"]
    return files


def stop_servers(reason):
    # `snakemake plan` only inspects: it must not stop a server left up (`servesweep up`).
    targets = set(workflow.dag_settings.targets)
    if PATHS.current_server.exists() and not (targets and targets <= {"plan"}):
        shutdown(EXP, PATHS, reason=reason)
