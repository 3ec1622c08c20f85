"""`servesweep plan`: what runs (missing cells, and cells whose record Snakemake will replace),
how many server starts, and an estimated wall time.

Durations come from earlier runs' orchestrator.log where the same server config (fingerprint)
and client config ran before, else from the simulator's cost model run offline (no sleeping).
The same estimates balance server configs over node pools (servesweep.cluster.pools), which run at
once: the wall time counts the longest pool's share.
Nothing here touches a node.
"""

from __future__ import annotations

import atexit
import dataclasses
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from servesweep.cluster.pools import PoolPlan, assign, node_pools, pooled_cells, read_previous
from servesweep.config.experiment import Experiment, dry_fire_enabled, start_waves
from servesweep.config.matrix import (
    CellRepeat,
    ServerSpec,
    cell_repeats,
    client_specs,
    selected_cases,
    server_specs,
)
from servesweep.config.paths import RunPaths
from servesweep.config.schema import Workload
from servesweep.core.events import read_events
from servesweep.measure import provenance
from servesweep.sim.estimate import closed_loop_seconds

K = TypeVar("K")

# A real SGLang start of a large MoE model across nodes (seed 000: "about ten minutes").
SGLANG_START_S = 600.0
# A dry fire (preflight.dry_fire) per start wave: a GUESS, not measured on the cluster. Dummy
# weights and one layer per pipeline stage leave about a warm start's imports, rendezvous and
# graph capture: the one-GPU rehearsal's warm starts took 55.9-71.0 s (2026-12-07).
SGLANG_DRY_FIRE_S = 65.0
# sglang-router's mini load balancer, from launch to /health 200 (16.7 s on the one-GPU PD
# rehearsal, docs/rehearsal/pd-2026-12-07).
ROUTER_START_S = 17.0
# Per cell-repeat outside the client's measured window, without history: Snakemake's job and
# the job's process start (1.0 s), the client's process start, GPU snapshots and sampler stop
# (1.5 s). Measured on the default sim run: cell-done `seconds` minus the record's duration,
# median 1.5 s; Snakemake's own gap between jobs about 0.8 s.
JOB_OVERHEAD_S = 1.0
CELL_FIXED_S = 1.5
# The analysis rules after the cells (results.csv, log scan, summary, plots, manifest): about
# 20 s on the default run.
ANALYSIS_S = 20.0
# One image check per node (docker pull or build, then the capability smoke): a guess.
IMAGE_BUILD_S = 60.0


# Why a cell-repeat runs. Snakemake reruns a cell whose params changed (profiles/default:
# rerun-triggers mtime, params); run_cell's params are the fingerprint, the workload key and
# measured_with, which holds both, and the record carries measured_with (provenance.KEY).
MISSING = "missing"
CHANGED_MEASUREMENT = "changed measurement"  # fingerprint, workload, warm-up
CHANGED_CODE = "changed code"  # only the client: its kind, version, tokenizer
REASONS = (MISSING, CHANGED_MEASUREMENT, CHANGED_CODE)


def rerun_reason(
    exp: Experiment, paths: RunPaths, cell: CellRepeat, *, present: Set[str] | None = None
) -> str | None:
    """Why `cell` runs (one of REASONS), None when its record stands: the params test
    Snakemake makes, on the record's own copy of them. An unreadable record is left to
    collect_results (Snakemake does not read it either). `present`: the run's raw files
    (RunPaths.raw_files), where known, instead of a stat."""
    raw = paths.raw(cell)
    if (str(raw) not in present) if present is not None else not raw.exists():
        return MISSING
    try:
        recorded = provenance.recorded(raw)
    except (OSError, ValueError):
        return None
    diff = provenance.differences(recorded, provenance.measured_with(exp, cell))
    if not diff:
        return None
    return CHANGED_CODE if all(d.startswith("client.") for d in diff) else CHANGED_MEASUREMENT


@dataclass(frozen=True)
class History:
    """Median durations seen in earlier runs: server readiness and warm-ups per fingerprint;
    cells (whole, and the client's measured window) per (fingerprint, client id)."""

    ready_s: dict[str, float]
    cell_s: dict[tuple[str, str], float]
    warmup_s: dict[str, float] = field(default_factory=dict)
    measured_s: dict[tuple[str, str], float] = field(default_factory=dict)
    dry_fire_s: dict[str, float] = field(default_factory=dict)


def read_history(results_dir: Path) -> History:
    """Collect durations from every results/*/orchestrator.log."""
    ready: dict[str, list[float]] = defaultdict(list)
    warmup: dict[str, list[float]] = defaultdict(list)
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    measured: dict[tuple[str, str], list[float]] = defaultdict(list)
    dry: dict[str, list[float]] = defaultdict(list)
    for log in sorted(results_dir.glob("*/orchestrator.log")):
        for _, event, f in read_events(log):
            if event == "ready" and "seconds" in f:
                ready[f["fp"]].append(float(f["seconds"]))
            elif event == "dry-fire-done" and "seconds" in f:
                dry[f["fp"]].append(float(f["seconds"]))
            elif event == "warmup" and "seconds" in f:
                warmup[f["fp"]].append(float(f["seconds"]))
            elif event == "cell-done" and "seconds" in f:
                key = (f["fp"], f["cell"].split("/")[1])
                cells[key].append(float(f["seconds"]))
                if "measured_seconds" in f:
                    measured[key].append(float(f["measured_seconds"]))

    def medians(table: Mapping[K, list[float]]) -> dict[K, float]:
        return {k: statistics.median(v) for k, v in table.items()}

    return History(
        ready_s=medians(ready),
        cell_s=medians(cells),
        warmup_s=medians(warmup),
        measured_s=medians(measured),
        dry_fire_s=medians(dry),
    )


def simulated_seconds(exp: Experiment, cell: CellRepeat, workload: Workload | None = None) -> float:
    """Wall seconds of one client run (`workload`, default the cell's) from the simulator's
    cost model (offline): the measured window, without the client's process start.

    For a PD set the prefill role's topology models the whole request (transfer and decode on
    the other role are not modelled here); for SGLang it is the simulator's default profile at
    real time, a rough guide until a run of the same config exists.
    """
    role = cell.server.roles[0]
    args = role.args
    w = workload or cell.client.workload
    seconds = closed_loop_seconds(
        tp_size=args.tp_size,
        ep_size=args.ep_size,
        dp_size=args.dp_size,
        pp_size=args.pp_size,
        nnodes=len(role.nodes),
        moe_runner_backend=args.moe_runner_backend or "auto",
        chunked_prefill_size=args.chunked_prefill_size,
        max_running_requests=args.max_running_requests,
        page_size=args.page_size,
        num_requests=w.num_requests,
        concurrency=w.concurrency,
        input_len=w.input_len,
        output_len=w.output_len,
    )
    scale = exp.engine.sim.time_scale if exp.engine.kind == "sim" else 1.0
    return seconds * scale


def start_s(exp: Experiment, spec: ServerSpec) -> float:
    """Estimated seconds from launch to ready without history: an engine start per start wave
    (config.experiment.start_waves: a PD set's engines together on disjoint GPUs, in turn on
    one GPU), then its router's."""
    waves = start_waves(exp.cluster, [(r.name, r.nodes) for r in spec.roles], router=None)
    if exp.engine.kind == "sim":
        return len(waves) * exp.engine.sim.startup_s * exp.engine.sim.time_scale + 1.0
    return len(waves) * SGLANG_START_S + (ROUTER_START_S if spec.router else 0.0)


def dry_fire_s(exp: Experiment, spec: ServerSpec) -> float:
    """Estimated seconds of a start's dry fire without history (0 when preflight.dry_fire is
    off): a sim's is its startup again; a real one SGLANG_DRY_FIRE_S per start wave."""
    if not dry_fire_enabled(exp):
        return 0.0
    waves = start_waves(exp.cluster, [(r.name, r.nodes) for r in spec.roles], router=None)
    if exp.engine.kind == "sim":
        return len(waves) * exp.engine.sim.startup_s * exp.engine.sim.time_scale + 1.0
    return len(waves) * SGLANG_DRY_FIRE_S + (ROUTER_START_S if spec.router else 0.0)


def start_estimate(exp: Experiment, spec: ServerSpec, history: History) -> float:
    """Seconds a start holds its GPUs: its dry fire, then launch to ready (history first)."""
    fp = spec.fingerprint
    dry = history.dry_fire_s.get(fp, dry_fire_s(exp, spec)) if dry_fire_enabled(exp) else 0.0
    return dry + history.ready_s.get(fp, start_s(exp, spec))


def config_estimates(exp: Experiment, history: History) -> dict[str, float]:
    """Seconds of every server config: one start and all its cells (history, else the cost
    model), the balance of the pool assignment."""
    out: dict[str, float] = {}
    simulated: dict[tuple[str, str], float] = {}
    for cell in cell_repeats(exp):
        fp, sid = cell.server.fingerprint, cell.server.id
        if sid not in out:
            out[sid] = start_estimate(exp, cell.server, history)
        key = (fp, cell.client.id)
        if key in history.cell_s:
            out[sid] += history.cell_s[key] + JOB_OVERHEAD_S
            continue
        if key not in simulated:
            simulated[key] = simulated_seconds(exp, cell)
        out[sid] += simulated[key] + CELL_FIXED_S + JOB_OVERHEAD_S
    return out


def pool_plan(
    *, exp: Experiment, paths: RunPaths, results_dir: Path, history: History | None = None
) -> PoolPlan:
    """Each server config's pool: kept from the run's pools.json, new ones balanced by the
    estimates (one pool: no estimate is computed)."""
    pools = tuple(node_pools(exp))
    ids = [spec.id for spec in server_specs(exp)]
    if len(pools) == 1:
        return PoolPlan(pools, dict.fromkeys(ids, 0), {})
    estimates = config_estimates(exp, history or read_history(results_dir))
    assignment = assign(
        server_ids=ids, pools=pools, estimates=estimates, previous=read_previous(paths.pools)
    )
    return PoolPlan(pools, assignment, estimates)


@dataclass(frozen=True)
class Plan:
    """What a run still has to do and how long it should take, by part (seconds)."""

    run_id: str
    total_cells: int
    missing: list[CellRepeat]
    starts: list[str]
    builds: int
    starts_s: float
    warmups_s: float
    measuring_s: float
    overhead_s: float  # per cell-repeat outside the measured window (Snakemake, client start)
    other_s: float  # image builds and the analysis rules: no server holds the GPUs
    from_history: int
    unestimated: int = 0  # configs left to the cost model beyond make_plan's max_simulated
    pools: PoolPlan | None = None
    pool_held_s: dict[int, float] = field(default_factory=dict)  # servers up, per pool
    reasons: dict[str, str] = field(default_factory=dict)  # cell key -> why it runs
    suite: str = ""  # "suite standard: 4 of 6 cases" when a suite selects the cases
    # Slurm (cluster.transport slurm): each pool's exact salloc line and the time limit (s)
    allocations: tuple[str, ...] = ()
    time_limit_s: float | None = None

    @property
    def replaced(self) -> int:
        """Measured records this plan replaces (kept under raw/.superseded/<time>/)."""
        return sum(r != MISSING for r in self.reasons.values())

    def why(self) -> str:
        """`3 missing, 21 changed measurement` (reasons in REASONS order)."""
        counts = [(r, sum(v == r for v in self.reasons.values())) for r in REASONS]
        return ", ".join(f"{n} {r}" for r, n in counts if n)

    def replacing(self) -> str:
        """The clause that ends the summary when measured records are replaced ("" if none)."""
        if not self.replaced:
            return ""
        return (
            f"; REPLACES {self.replaced} measured record(s) "
            f"(kept under {self.run_id}/raw/.superseded/<time>/)"
        )

    @property
    def estimate_s(self) -> float:
        """Pools run at once: the longest pool's server time, then builds and analysis."""
        held = self.starts_s + self.warmups_s + self.measuring_s + self.overhead_s
        if len(self.pool_held_s) > 1:
            held = max(self.pool_held_s.values())
        return held + self.other_s

    @property
    def measuring_share(self) -> float:
        """The share of the time servers hold the GPUs that is spent measuring."""
        held = self.starts_s + self.warmups_s + self.measuring_s + self.overhead_s
        return self.measuring_s / held if held else 0.0

    def summary(self) -> str:
        """One line: what runs and how long it takes (the end of `snakemake -n`)."""
        why = f" ({self.why()})" if self.missing else ""
        suite = f" ({self.suite})" if self.suite else ""
        head = (
            f"servesweep plan: run {self.run_id}{suite}: {len(self.missing)} of "
            f"{self.total_cells} cell-repeats to run{why}, {len(self.starts)} server starts, "
            f"{self.builds} image builds"
        )
        if self.unestimated:
            return (
                f"{head}; no estimate here ({self.unestimated} server x client configs for "
                f"the cost model): `servesweep plan` gives it{self.replacing()}"
            )
        return (
            f"{head}; estimated {_duration(self.estimate_s)}, measuring "
            f"{self.measuring_share:.0%} of GPU time (`servesweep plan` splits it)"
            f"{self.replacing()}"
        )

    def render(self) -> str:
        lines = [
            f"run {self.run_id}{f' ({self.suite})' if self.suite else ''}: "
            f"{len(self.missing)} of {self.total_cells} cell-repeats to run"
            + (f" ({self.why()})" if self.missing else ""),
            f"server starts: {len(self.starts)} ({', '.join(self.starts) or 'none'})",
            f"image builds: {self.builds}",
            f"estimated wall time: {_duration(self.estimate_s)} "
            f"({self.from_history} of {len(self.missing)} cells timed from earlier runs, "
            f"the rest from the simulator's cost model)",
            f"  server starts  {_duration(self.starts_s):>9}",
            f"  warm-ups       {_duration(self.warmups_s):>9}",
            f"  measuring      {_duration(self.measuring_s):>9}",
            f"  between cells  {_duration(self.overhead_s):>9}  (Snakemake jobs, client starts, "
            f"GPU snapshots)",
            f"  builds+analysis{_duration(self.other_s):>9}  (no server up)",
            f"measuring is {self.measuring_share:.0%} of the time servers hold the GPUs",
        ]
        if self.pools is not None:
            lines.append(f"node pools: {len(self.pools.pools)} (one server set at a time each)")
            for pool in self.pools.pools:
                servers = self.pools.servers(pool.index)
                lines.append(
                    f"  pool {pool.index}: nodes {','.join(pool.nodes)}; {len(servers)} server "
                    f"config(s), missing work "
                    f"{_duration(self.pool_held_s.get(pool.index, 0.0))}: "
                    f"{' '.join(servers) or 'none'}"
                )
        for cell in self.missing:
            why = self.reasons.get(cell.key, MISSING)
            lines.append(f"  {cell.key} (pool {cell.server.pool}, {why})")
        if self.replaced:
            lines.append(self.replacing().removeprefix("; "))
        lines += self.slurm_lines()
        return "\n".join(lines) + "\n"

    def slurm_lines(self) -> list[str]:
        """The allocations a Slurm run makes, and whether their time limit covers the
        estimate (an allocation that ends first takes its servers with it)."""
        if self.time_limit_s is None:
            return []
        lines = [f"slurm allocations: {len(self.allocations)} (one per pool, made at first use)"]
        lines += [f"  {line}" for line in self.allocations]
        limit, need = _duration(self.time_limit_s), _duration(self.estimate_s)
        if self.unestimated:
            lines.append(f"slurm time limit {limit}: no estimate to compare it with")
        elif self.time_limit_s >= self.estimate_s:
            lines.append(f"slurm time limit {limit} covers the estimate {need}")
        else:
            lines.append(
                f"WARNING: slurm time limit {limit} is shorter than the estimate {need}: "
                f"raise cluster.slurm.time_limit"
            )
        return lines


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def make_plan(
    *,
    exp: Experiment,
    paths: RunPaths,
    results_dir: Path,
    cells: Sequence[CellRepeat] | None = None,
    max_simulated: int | None = None,
) -> Plan:
    """`_make_plan`, with a Slurm run's allocations and time limit."""
    plan = _make_plan(
        exp=exp, paths=paths, results_dir=results_dir, cells=cells, max_simulated=max_simulated
    )
    if exp.cluster.transport != "slurm":
        return plan
    from servesweep.cluster.slurm import planned_allocations, time_limit_seconds

    return dataclasses.replace(
        plan,
        allocations=tuple(planned_allocations(exp, results_root=results_dir)),
        time_limit_s=time_limit_seconds(exp.cluster.slurm.time_limit),
    )


def _make_plan(
    *,
    exp: Experiment,
    paths: RunPaths,
    results_dir: Path,
    cells: Sequence[CellRepeat] | None = None,
    max_simulated: int | None = None,
) -> Plan:
    """The cell-repeats to run (no raw file yet, or one Snakemake replaces: rerun_reason),
    their server starts and pools, missing
    image checks and the time estimate by part. `cells`: the run's cell-repeats (each in its
    pool) if already expanded. `max_simulated`: at most this many (server, client) configs are
    run through the cost model (about 15 ms each); with more, the plan has no estimate
    (`unestimated`)."""
    history = read_history(results_dir)
    pools = pool_plan(exp=exp, paths=paths, results_dir=results_dir, history=history)
    cells = list(cells) if cells is not None else pooled_cells(exp, pools)
    present = paths.raw_files()
    why = {c.key: rerun_reason(exp, paths, c, present=present) for c in cells}
    reasons = {k: r for k, r in why.items() if r is not None}
    missing = [c for c in cells if c.key in reasons]
    builds = sum(not p.exists() for p in paths.builds(exp)) if missing else 0
    to_simulate = {(c.server.fingerprint, c.client.id) for c in missing} - set(history.cell_s)
    if max_simulated is not None and len(to_simulate) > max_simulated:
        return Plan(
            run_id=exp.run_id,
            total_cells=len(cells),
            missing=missing,
            starts=list(dict.fromkeys(c.server.fingerprint for c in missing)),
            builds=builds,
            starts_s=0.0,
            warmups_s=0.0,
            measuring_s=0.0,
            overhead_s=0.0,
            other_s=0.0,
            from_history=0,
            unestimated=len(to_simulate),
            pools=pools,
            reasons=reasons,
            suite=suite_note(exp),
        )
    first: dict[str, CellRepeat] = {}
    for cell in missing:
        # A `servesweep up` service of the config is reused: no start, no warm-up (seed 003's
        # flow). Its record says it is up; the plan touches no node to ask.
        if not paths.service_record(cell.server.fingerprint).exists():
            first.setdefault(cell.server.fingerprint, cell)
    # A server config whose cells are all measured but whose equivalence probe is missing (a
    # run from before the probe, a changed probe) starts for the probe alone.
    if exp.equivalence.enabled:
        for cell in {c.server.fingerprint: c for c in cells}.values():
            fp = cell.server.fingerprint
            if fp in first or paths.service_record(fp).exists():
                continue
            if not paths.probe(cell.server.id).exists():
                first[fp] = cell
    held: dict[int, float] = defaultdict(float)
    for cell in first.values():
        held[cell.server.pool] += start_estimate(exp, cell.server, history)
    starts_s = sum(start_estimate(exp, c.server, history) for c in first.values())
    warmups_s = 0.0
    if exp.warmup_after_start:
        shape = client_specs(exp)[0].workload.model_copy(
            update={"num_requests": exp.warmup_after_start, "concurrency": 1}
        )
        for fp, cell in first.items():
            seconds = history.warmup_s.get(fp) or (
                simulated_seconds(exp, cell, shape) + CELL_FIXED_S
            )
            warmups_s += seconds
            held[cell.server.pool] += seconds
    measuring_s = overhead_s = 0.0
    timed = 0
    simulated: dict[tuple[str, str], float] = {}
    for cell in missing:
        key = (cell.server.fingerprint, cell.client.id)
        if key in history.cell_s:
            timed += 1
            whole = history.cell_s[key]
            measured = history.measured_s.get(key, max(whole - CELL_FIXED_S, 0.0))
        else:
            if key not in simulated:
                simulated[key] = simulated_seconds(exp, cell)
            measured = simulated[key]
            whole = measured + CELL_FIXED_S
        measuring_s += measured
        overhead_s += whole - measured + JOB_OVERHEAD_S
        held[cell.server.pool] += whole + JOB_OVERHEAD_S
    other_s = builds * IMAGE_BUILD_S + (ANALYSIS_S if missing else 0.0)
    return Plan(
        run_id=exp.run_id,
        total_cells=len(cells),
        missing=missing,
        starts=list(first),
        builds=builds,
        starts_s=starts_s,
        warmups_s=warmups_s,
        measuring_s=measuring_s,
        overhead_s=overhead_s,
        other_s=other_s,
        from_history=timed,
        pools=pools,
        pool_held_s=dict(held),
        reasons=reasons,
        suite=suite_note(exp),
    )


def suite_note(exp: Experiment) -> str:
    """Which cases a suite selects, for the plan line ("" without cases or a suite)."""
    if not exp.cases or exp.suite in (None, "all"):
        return ""
    chosen = len(selected_cases(exp))
    return f"suite {exp.suite}: {chosen} of {len(exp.cases)} cases, SUITE=all runs every case"


# Snakemake's short options that take no value (a cluster like `-np` may hold `-n`).
_FLAG_LETTERS = frozenset("npqrkFftSD")


def dry_run_requested(argv: Sequence[str]) -> bool:
    """Whether a Snakemake command line asks for a dry-run (`-n`, `--dry-run`, `--dryrun`,
    or `-n` in a cluster of valueless short flags such as `-np`)."""
    for arg in argv[1:]:
        if arg in ("--dry-run", "--dryrun"):
            return True
        short = arg.startswith("-") and not arg.startswith("--")
        if short and "n" in arg[1:] and set(arg[1:]) <= _FLAG_LETTERS:
            return True
    return False


# The dry-run line's budget for the cost model: about 0.75 s (`servesweep plan` has none).
DRY_RUN_MAX_SIMULATED = 50


def summary_at_exit(
    *, exp: Experiment, paths: RunPaths, results_dir: Path, cells: Sequence[CellRepeat]
) -> None:
    """Print Plan.summary() on stdout when the process exits: after Snakemake's last dry-run
    line, as the last line. Snakemake runs no handler on a dry-run (`onstart` and friends
    are skipped), so the Snakefile registers this at parse time when `dry_run_requested`.
    Paths are made absolute now: Snakemake may leave the working directory (`-d`) first."""
    paths, results_dir = RunPaths(paths.root.resolve()), results_dir.resolve()

    def show() -> None:
        plan = make_plan(
            exp=exp,
            paths=paths,
            results_dir=results_dir,
            cells=cells,
            max_simulated=DRY_RUN_MAX_SIMULATED,
        )
        print(plan.summary(), flush=True)

    atexit.register(show)
