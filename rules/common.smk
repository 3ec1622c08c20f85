# Load + validate config, apply env narrowing, expand the matrix, constrain wildcards, helpers.
import datetime as dt
import os
import sys

# No module here imports pandas or numpy (a dry-run pays none of the analysis imports).
from servesweep.analysis.planned import (
    expected_delta_note,
    key_plots,
    plot_metrics,
    run_inputs,
)
from servesweep.analysis.reference import load_reference
from servesweep.analysis.verdict import check_gate
from servesweep.cluster import pools
from servesweep.config.load import load_experiment, unnarrowed_env
from servesweep.config.matrix import (
    axis_names,
    client_specs,
    measured_config,
    probe_priority,
)
from servesweep.config.paths import RunPaths, aggregate_cells
from servesweep.core.errors import ConfigError
from servesweep.core.parallel import usable_cores
from servesweep.measure.probe import probe_key
from servesweep.measure.provenance import CellParams
from servesweep.serving.engines import check_experiment
from servesweep.workflow import progress
from servesweep.workflow.heap import collect_less_often
from servesweep.workflow.jobconfig import per_job
from servesweep.workflow.logsetup import hangup_like_sigterm
from servesweep.workflow.lostmetadata import changed_without_metadata
from servesweep.workflow.plan import dry_run_requested, pool_plan, summary_at_exit
from servesweep.workflow.ratelimit import unthrottle_scheduler

# Snakemake's heap of 10k jobs: fewer full garbage collections (servesweep.workflow.heap).
collect_less_often()

try:
    EXP = load_experiment(
        config,
        os.environ,
        site_dir=os.path.join(workflow.basedir, "config", "site"),
        default_config=os.path.join(workflow.basedir, "config", "config.yaml"),
    )
    PATHS = RunPaths.for_run(EXP)
    # Each server config's node pool (servesweep.cluster.pools), kept stable across matrix extensions.
    POOLS = pool_plan(exp=EXP, paths=PATHS, results_dir=PATHS.root.parent)
    SPECS = pools.pooled_specs(EXP, POOLS)
    # The run's configured matrix (BACKENDS_CSV, SUITE, ... only select what runs now).
    NARROWED = unnarrowed_env(os.environ) != dict(os.environ)
    CONFIGURED = (
        load_experiment(
            config,
            unnarrowed_env(os.environ),
            site_dir=os.path.join(workflow.basedir, "config", "site"),
        )
        if NARROWED
        else EXP
    )
    # The reference table (config `reference.file`, relative to the checkout), checked now.
    REFERENCE_FILES = (
        [os.path.join(workflow.basedir, EXP.reference.file)] if EXP.reference else []
    )
    for path in REFERENCE_FILES:
        load_reference(path, cases=list(EXP.cases))
    check_gate(EXP)
    check_experiment(EXP, SPECS, os.environ)
except ConfigError as exc:
    sys.exit(f"servesweep: ConfigError: {exc}")

RUN_DIR = str(PATHS.root)
LOGS = str(PATHS.logs)
CELLS = {cell.key: cell for cell in pools.pooled_cells(EXP, POOLS)}
# `snakemake -n` ends with the plan's one line (no Snakemake handler runs on a dry-run).
if dry_run_requested(sys.argv):
    summary_at_exit(
        exp=EXP, paths=PATHS, results_dir=PATHS.root.parent, cells=list(CELLS.values())
    )
# .snakemake/ lost: a record measured with another configuration reruns through a marker input
# (servesweep.workflow.lostmetadata); {} while Snakemake has its metadata.
CHANGED = changed_without_metadata(exp=EXP, paths=PATHS, cells=list(CELLS.values()))
# A params entry of collect_results: a changed SLO recomputes results.csv, never a cell.
SLO = EXP.slo.model_dump()
# A params entry of summarize: a changed gate rechecks the medians, never a cell.
GATE = [rule.model_dump(mode="json") for rule in EXP.gate]
PLOT_METRICS = plot_metrics(EXP)
RESULTS_ROOT = str(PATHS.root.parent)
SERVER_AXES, CLIENT_AXES = axis_names(CONFIGURED)
# scan_logs counts them in every server log (the per-cell minimums are run_cell's).
EVIDENCE_PATTERNS = {name: p.pattern for name, p in EXP.evidence.items()}
PLOT_X = next(iter(axis_names(EXP)[1]), None) if not EXP.cases else None
# collect_results and summarize fork a worker per thread: every CPU here, which Snakemake caps
# at --cores (`workflow.cores` is an error where no --cores is given: --report, --lint).
TABLE_THREADS = usable_cores()


wildcard_constraints:
    server=r"[^/]+",
    client=r"[^/]+",
    repeat=r"\d+",
    node=r"[^/]+",
    run_a=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    run_b=r"[A-Za-z0-9][A-Za-z0-9._-]*",


def cell_key(wildcards):
    return f"{wildcards.server}/{wildcards.client}/r{wildcards.repeat}"


def cell_of(wildcards):
    return KNOWN_CELLS[cell_key(wildcards)]


# run_cell's params (its rerun triggers), computed once per config and cell (CELL_PARAMS).
@per_job
def cell_fingerprint(wildcards):
    return CELL_PARAMS.fingerprint(cell_key(wildcards))


@per_job
def cell_workload(wildcards):
    return CELL_PARAMS.workload(cell_key(wildcards))


@per_job
def cell_measured_with(wildcards):
    return CELL_PARAMS.measured_with(cell_key(wildcards))


@per_job
def cell_changed(wildcards):
    key = f"{wildcards.server}/{wildcards.client}/r{wildcards.repeat}"
    return [CHANGED[key]] if key in CHANGED else []


@per_job
def cell_priority(wildcards):
    return cell_of(wildcards).priority


@per_job
def cell_pool(wildcards):
    return cell_of(wildcards).server.pool


def probe_fingerprint(wildcards):
    return SERVERS[wildcards.server].fingerprint


def probe_priority_of(wildcards):
    return PROBE_PRIORITIES[wildcards.server]


def probe_pool(wildcards):
    return SERVERS[wildcards.server].pool


# run_cell takes its pool's resource (profiles/default: pool_<i>=1); image checks and
# preflight take every pool's.
CELL_RESOURCES = pools.cell_resources(POOLS, cell_pool)
PROBE_RESOURCES = pools.cell_resources(POOLS, probe_pool)
EVERY_POOL = pools.every_pool(POOLS)


# Computed once (10k cells: ~1 s per listing), in matrix order; `all` and collect_results list
# the raw files, collect_results the GPU snapshots (it reads both).
RAW_FILES = [str(PATHS.raw(cell)) for cell in CELLS.values()]
# What results.csv and the summary cover: these cells and every other finished cell-repeat of
# the configured matrix (a narrowed run never shrinks them); keys in matrix order.
AGGREGATED = (
    aggregate_cells(
        selected=list(CELLS.values()),
        configured=pools.pooled_cells(
            CONFIGURED,
            pool_plan(exp=CONFIGURED, paths=PATHS, results_dir=PATHS.root.parent),
        ),
        paths=PATHS,
    )
    if NARROWED
    else list(CELLS.values())
)
AGGREGATED_KEYS = [cell.key for cell in AGGREGATED]
# A finished cell outside the selection is an input of collect_results: its job is known too.
KNOWN_CELLS = {cell.key: cell for cell in AGGREGATED} | CELLS
CELL_PARAMS = CellParams(EXP, KNOWN_CELLS)
# Not narrowed: the same cells in the same order as RAW_FILES (10k paths built once, not twice).
AGGREGATED_RAW = (
    [str(PATHS.raw(cell)) for cell in AGGREGATED] if NARROWED else RAW_FILES
)
AGGREGATED_GPU = [str(PATHS.gpu(cell)) for cell in AGGREGATED]
BUILDS = [str(p) for p in PATHS.builds(EXP)]
BUILD_LOGS = [str(p) for p in PATHS.build_logs(EXP)]
# Image checks and preflight run before any cell. Once a run has cells they are no input of a
# cell: Snakemake (9.27) does not look at jobs downstream of a job it reruns through ancient()
# inputs that exist, so a rerun preflight (a new server config) would hide missing cells, and
# without ancient() it would rerun finished ones. A priority above every server config's and
# every pool's resource order them; `all` and collect_results request them; run_cell
# refuses to start a server without them. On a fresh run (no raw file yet) the missing evidence
# is an input of every cell, so a cell targeted alone (`-f .../r2.jsonl`) builds it first. A
# constant list, not an input function: 10k calls of one cost ~0.4x a plain dry-run
# (docs/architecture.md).
PREREQUISITES = [*BUILDS, str(PATHS.preflight)]
# The equivalence probe of each server config (measure.probe), right before its cells.
PROBE_KEY = probe_key(EXP)
# Every server config of the aggregate (a narrowed run's others too: their probe files are
# inputs of compare_outputs, so Snakemake asks for their params).
SERVERS = {cell.server.id: cell.server for cell in KNOWN_CELLS.values()}
SELECTED_SERVERS = {spec.id for spec in SPECS}
PROBE_PRIORITIES = {
    server.id: probe_priority(
        server, repeats=EXP.repeats, clients=len(client_specs(EXP))
    )
    for server in SERVERS.values()
}
# Every probed server config of the aggregate: this run's selection, and the configured
# ones a narrowed run leaves alone but probed before.
PROBES = (
    [
        str(PATHS.probe(server))
        for server in dict.fromkeys(cell.server.id for cell in AGGREGATED)
        if server in SELECTED_SERVERS or PATHS.probe(server).exists()
    ]
    if EXP.equivalence.enabled
    else []
)
EQUIVALENCE = [str(PATHS.equivalence_json)] if PROBES else []
PREREQUISITE_PRIORITY = (
    max(
        max(cell.priority for cell in CELLS.values()),
        max(PROBE_PRIORITIES.values()),
    )
    + 1
)
FRESH_RUN = next((PATHS.root / "raw").glob("*/*/r*.jsonl"), None) is None
CELL_PREREQUISITES = (
    [p for p in PREREQUISITES if not os.path.exists(p)] if FRESH_RUN else []
)
# Preflight checks every server config: a new or changed one reruns it.
SERVER_FINGERPRINTS = sorted(spec.fingerprint for spec in SPECS)


# A run without deltas (one backend, a PD run) draws no delta plots; the landing page says why.
DELTA_NOTE = expected_delta_note(EXP)
DELTA_PLOTS = (
    {m: f"{RUN_DIR}/plots/delta_{m}.png" for m in PLOT_METRICS}
    if DELTA_NOTE is None
    else {}
)
METRIC_VS_PLOTS = (
    {m: f"{RUN_DIR}/plots/{m}_vs_{PLOT_X}.png" for m in PLOT_METRICS} if PLOT_X else {}
)
ENERGY_PLOTS = [f"{RUN_DIR}/plots/energy_goodput_vs_{PLOT_X}.png"] if PLOT_X else []
# PD: where each case's time to first token went (the server's /metrics, docs/outputs.md).
TTFT_PLOTS = [f"{RUN_DIR}/plots/ttft_breakdown.png"] if EXP.roles else []
SERVER_SERIES_PLOT = f"{RUN_DIR}/plots/server_series.png"
KEY_PLOTS = key_plots(deltas=DELTA_PLOTS, metric_vs=METRIC_VS_PLOTS, x=PLOT_X)


def report_page():
    """The report's first page: the run's answer once written (rule write_landing_page),
    the method before that."""
    landing = os.path.abspath(PATHS.landing_rst)
    return landing if os.path.exists(landing) else "report/method.rst"


def all_case_tables():
    return [f"{RUN_DIR}/cases.md", f"{RUN_DIR}/cases.html"] if EXP.cases else []


def service_files(kind):
    """An input function: what the run's servers left in service/ (RunPaths.service_files),
    known once the cells ran, i.e. after the collect_results checkpoint."""

    def files(wildcards):
        checkpoints.collect_results.get()
        return [str(p) for p in PATHS.service_files()[kind]]

    return files


def server_series(wildcards):
    """The cells' /metrics series that exist once the cells ran (run_cell's log: a record
    measured before the series existed has none)."""
    checkpoints.collect_results.get()
    return [str(p) for p in PATHS.existing_metrics(AGGREGATED)]


def run_events(wildcards):
    """orchestrator.log once the cells ran, where there is one; ancient: the servers' stop
    after the jobs appends to it."""
    checkpoints.collect_results.get()
    found = PATHS.orchestrator_log.exists()
    return [ancient(str(PATHS.orchestrator_log))] if found else []


def compare_inputs(wildcards):
    """results.csv and requests.csv (where there is one) of runs A and B of a comparison."""
    files = {}
    for side, run in (("a", wildcards.run_a), ("b", wildcards.run_b)):
        found = run_inputs(run_dir=f"{RESULTS_ROOT}/{run}", current=run == EXP.run_id)
        files[f"csv_{side}"] = found["csv"]
        files[f"requests_{side}"] = found["requests"]
        files[f"probes_{side}"] = found["probes"]
    return files


# This invocation's hold on the run (lock_run): open until Snakemake's process ends.
RUN_LOCK = []


def lock_run():
    """onstart, first: a second live snakemake of this run (after `snakemake --unlock`) stops
    here, before any other handler or job touches the live run's records or servers."""
    from servesweep.core.errors import RunLocked
    from servesweep.measure.locks import hold_run_lock

    holder = f"snakemake pid {os.getpid()}"
    try:
        RUN_LOCK.append(hold_run_lock(PATHS.run_lock, run_id=EXP.run_id, holder=holder))
    except RunLocked as exc:
        sys.exit(f"servesweep: RunLocked: {exc}")


def check_secrets_at_start():
    """onstart (a real run, before any job): a config that needs sudo has its password."""
    from servesweep.core.errors import SecretError
    from servesweep.cluster.secrets import check_secrets

    try:
        check_secrets(
            sudo=EXP.runtime.kind == "docker" and EXP.runtime.sudo,
            default_file=EXP.secrets.sudo_password_file,
            passwordless=EXP.secrets.passwordless_sudo,
            env=os.environ,
        )
    except SecretError as exc:
        sys.exit(f"servesweep: SecretError: {exc}")


def keep_console():
    """onstart: what this invocation prints is kept in the run folder too (console.log)."""
    from servesweep.workflow.console import tee_console

    tee_console(PATHS.console_log, sys.argv)


def start_pools():
    """onstart: persist the pool assignment; a pool stopped by a failure runs again."""
    pools.write_plan(PATHS.pools, POOLS)
    for pool in POOLS.pools:
        PATHS.pool_stopped(pool.index).unlink(missing_ok=True)


def supersede_replaced():
    """onstart: every measured record a run_cell job of this invocation replaces is kept under
    raw/.superseded/<UTC time>/ first. Which jobs run is Snakemake's own decision (its DAG);
    without that internal, every cell the plan would run (the same params test)."""
    from servesweep.core.events import EventLog
    from servesweep.workflow.plan import rerun_reason
    from servesweep.workflow.superseded import supersede

    try:
        jobs = [j for j in workflow.dag.needrun_jobs() if j.rule.name == "run_cell"]
        reasons = {
            (j.wildcards.server, j.wildcards.client, int(j.wildcards.repeat)): (
                rerun_reason(EXP, PATHS, cell_of(j.wildcards))
                or str(workflow.dag.reason(j)).splitlines()[0]
            )
            for j in jobs
        }
    except AttributeError:  # a Snakemake without these internals
        why = {
            (c.server.id, c.client.id, c.repeat): rerun_reason(EXP, PATHS, c)
            for c in CELLS.values()
        }
        reasons = {k: r for k, r in why.items() if r is not None}
    supersede(
        paths=PATHS,
        cells=list(reasons),
        reasons=reasons,
        events=EventLog(PATHS.orchestrator_log),
    )


def remove_partial_files():
    """onstart: the hidden client files killed jobs left (they may hold the API key)."""
    from servesweep.core.events import EventLog
    from servesweep.measure.client import remove_run_partials

    remove_run_partials(PATHS.root, events=EventLog(PATHS.orchestrator_log))


def start_progress():
    """onstart: the cell-repeats this run has to write; each prints its line when done."""
    progress.start(
        path=PATHS.progress, planned=[p for p in RAW_FILES if not os.path.exists(p)]
    )


def print_answer():
    """onsuccess: the run's answer, warnings and file paths, last on the console; where the
    command line targets comparisons (rules/compare.smk), each comparison's block instead,
    as `servesweep compare` prints it."""
    # Imported here: pandas, which no dry-run needs.
    from servesweep.analysis import answer
    from servesweep.workflow.snakelog import comparison_targets, refresh_command

    compared = comparison_targets(sys.argv)
    for path in compared:
        answer.print_comparison(comparison_json=path, metrics=PLOT_METRICS)
    if compared:
        return
    answer.print_answer(
        summary_json=PATHS.summary_json,
        results_csv=PATHS.results_csv,
        report_html=PATHS.report_html,
        metrics=PLOT_METRICS,
        events=PATHS.orchestrator_log,
        # A record newer than results.csv (a cell targeted alone): no stale answer.
        records=AGGREGATED_RAW,
        refresh=refresh_command(sys.argv, os.environ),
        exp=EXP,
        cases=all_case_tables(),
        reference=REFERENCE_FILES,
    )


def fail_validation():
    """onsuccess, after the answer: a fatal finding of the final log scan or a missed gate
    bound exits 1 with its named line (the measured records stay)."""
    from servesweep.analysis.verdict import exit_message
    from servesweep.analysis.summary import read_summary

    if os.path.exists(PATHS.summary_json):
        message = exit_message(read_summary(PATHS.summary_json))
        if message:
            sys.exit(message)


# orchestrator.log's stamp when this invocation read the Snakefile (before any job).
INVOCATION_STARTED = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def report_lost_cells():
    """onerror: a cell whose job was SIGKILLed (no handler ran in it) gets its line, its
    `cell-failed` event, its left client stopped and its hidden client file removed."""
    from servesweep.workflow.lostcells import report_lost_cells as report

    lines = report(
        exp=EXP, cells=list(CELLS.values()), paths=PATHS, since=INVOCATION_STARTED
    )
    for line in lines:
        print(line, file=sys.stderr, flush=True)


def report_missing():
    """onerror: which cells are missing and why, per pool (also in missing.txt)."""
    from servesweep.core.files import write_text_atomic

    text = pools.missing_report(list(CELLS.values()), PATHS)
    if text:
        write_text_atomic(PATHS.root / "missing.txt", text)
        print(text, file=sys.stderr, end="")


def stop_servers(reason):
    if any(PATHS.current_server_of(p.index).exists() for p in POOLS.pools):
        # Imported here: only a run with a server up needs it.
        from servesweep.serving.servers import shutdown

        shutdown(EXP, PATHS, reason=reason)
    else:
        from servesweep.cluster.access import release

        release(EXP)  # a Slurm allocation made before any server started
