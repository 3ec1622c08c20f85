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
from servesweep.engines import check_experiment
from servesweep import forkserver
from servesweep import jobs
from servesweep.errors import ConfigError
from servesweep.scripting import export_config, unthrottle_scheduler

if not workflow.overwrite_configfiles:
    workflow.configfile(os.path.join(workflow.basedir, "config", "config.yaml"))

try:
    EXP = load_experiment(config, os.environ)
    SPECS = server_specs(EXP)
    check_experiment(EXP, SPECS)
except ConfigError as exc:
    sys.exit(f"servesweep: ConfigError: {exc}")

if workflow.global_resources.get("gpu_server") != 1:
    sys.exit(
        "servesweep: resources gpu_server=1 is missing (did --resources replace the "
        "workflow profile's list?); add gpu_server=1 to --resources"
    )

export_config(config)  # for `shell:` jobs (run_cell)
PYTHON = sys.executable
RUN_CELL_SCRIPT = os.path.join(workflow.basedir, "scripts", "run_cell.py")
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


# Computed once (10k cells: ~1 s per listing); `all` and collect_results list them.
RAW_FILES = [str(PATHS.raw(cell)) for cell in CELLS.values()]


# Image checks and preflight are inputs of `all` and collect_results, not of run_cell: thousands of
# pending cells with file inputs make the scheduler re-stat them every round (docs/performance.md),
# and a finished cell must not rerun when an image is re-validated. They still run before any
# cell: a higher priority than every server config and the same gpu_server resource; run_cell
# refuses to start a server without their evidence (servesweep.cells.check_prerequisites).
PREREQUISITES = [str(p) for p in PATHS.prerequisites(EXP)]
PREREQUISITE_PRIORITY = max(spec.priority for spec in SPECS) + 1
BUILDS = [str(p) for p in PATHS.builds(EXP)]
# Preflight checks every server config: a new or changed one reruns it.
SERVER_FINGERPRINTS = sorted(spec.fingerprint for spec in SPECS)


DELTA_PLOTS = {m: f"{RUN_DIR}/plots/delta_{m}.png" for m in PLOT_METRICS}
METRIC_VS_PLOTS = (
    {m: f"{RUN_DIR}/plots/{m}_vs_{PLOT_X}.png" for m in PLOT_METRICS} if PLOT_X else {}
)


def all_case_tables():
    return [f"{RUN_DIR}/cases.md", f"{RUN_DIR}/cases.html"] if EXP.cases else []


def compare_inputs(wildcards):
    """results.csv (+ raw files where present) of runs A and B of a comparison."""
    from servesweep.compare import run_inputs  # only comparisons need it

    files = {}
    for side, run in (("a", wildcards.run_a), ("b", wildcards.run_b)):
        current = RAW_FILES if run == EXP.run_id else None
        found = run_inputs(run_dir=Path(RESULTS_ROOT) / run, current_raw=current)
        files[f"csv_{side}"] = found["csv"]
        files[f"raw_{side}"] = found["raw"]
    return files


def stop_servers(reason):
    # `snakemake plan` only inspects: it must not stop a server left up (`servesweep up`).
    targets = set(workflow.dag_settings.targets)
    if PATHS.current_server.exists() and not (targets and targets <= {"plan"}):
        # Imported here: only a run with a server up needs it.
        from servesweep.servers import shutdown

        shutdown(EXP, PATHS, reason=reason)
