"""`servesweep plan`: what is missing, how many server starts, and an estimated wall time.

Durations come from earlier runs' orchestrator.log where the same server config (fingerprint)
and client config ran before, else from the simulator's cost model run offline (no sleeping).
The same estimates balance server configs over node pools (servesweep.pools). Nothing here
touches a node.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from servesweep.config import CellRepeat, Experiment, cell_repeats, server_specs
from servesweep.events import read_events
from servesweep.paths import RunPaths
from servesweep.pools import PoolPlan, assign, node_pools, pooled_cells, read_previous
from servesweep.sim.estimate import closed_loop_seconds

# A real SGLang start of a large MoE model across nodes (seed 000: "about ten minutes").
SGLANG_START_S = 600.0
# Snakemake's own cost per job here (process start, DAG bookkeeping), and the analysis rules.
JOB_OVERHEAD_S = 1.0
ANALYSIS_S = 20.0


@dataclass(frozen=True)
class History:
    """Median durations seen in earlier runs: server readiness per fingerprint, cells per
    (fingerprint, client id)."""

    ready_s: dict[str, float]
    cell_s: dict[tuple[str, str], float]


def read_history(results_dir: Path) -> History:
    """Collect durations from every results/*/orchestrator.log."""
    ready: dict[str, list[float]] = defaultdict(list)
    cells: dict[tuple[str, str], list[float]] = defaultdict(list)
    for log in sorted(results_dir.glob("*/orchestrator.log")):
        for _, event, f in read_events(log):
            if event == "ready" and "seconds" in f:
                ready[f["fp"]].append(float(f["seconds"]))
            elif event == "cell-done" and "seconds" in f:
                client_id = f["cell"].split("/")[1]
                cells[(f["fp"], client_id)].append(float(f["seconds"]))
    return History(
        ready_s={k: statistics.median(v) for k, v in ready.items()},
        cell_s={k: statistics.median(v) for k, v in cells.items()},
    )


def simulated_cell_s(exp: Experiment, cell: CellRepeat) -> float:
    """Wall seconds of one cell-repeat from the simulator's cost model (offline).

    For a PD set the prefill role's topology models the whole request (transfer and decode on
    the other role are not modelled here); for SGLang it is the simulator's default profile at
    real time, a rough guide until a run of the same config exists.
    """
    role = cell.server.roles[0]
    args = role.args
    w = cell.client.workload
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


def start_s(exp: Experiment) -> float:
    """Estimated seconds from start to ready without history."""
    if exp.engine.kind == "sim":
        return exp.engine.sim.startup_s * exp.engine.sim.time_scale + 1.0
    return SGLANG_START_S


class CellTimes:
    """Estimated seconds of starts and cells: earlier runs' medians, else the cost model."""

    def __init__(self, exp: Experiment, history: History) -> None:
        self.exp = exp
        self.history = history
        self.simulated: dict[tuple[str, str], float] = {}

    def start(self, fingerprint: str) -> float:
        return self.history.ready_s.get(fingerprint, start_s(self.exp))

    def cell(self, cell: CellRepeat) -> tuple[float, bool]:
        """(seconds incl. the job overhead, whether an earlier run timed it)."""
        key = (cell.server.fingerprint, cell.client.id)
        if key in self.history.cell_s:
            return self.history.cell_s[key] + JOB_OVERHEAD_S, True
        if key not in self.simulated:
            self.simulated[key] = simulated_cell_s(self.exp, cell)
        return self.simulated[key] + JOB_OVERHEAD_S, False


def config_estimates(exp: Experiment, times: CellTimes) -> dict[str, float]:
    """Seconds of every server config: one start and all its cells."""
    out: dict[str, float] = {}
    for cell in cell_repeats(exp):
        sid = cell.server.id
        if sid not in out:
            out[sid] = times.start(cell.server.fingerprint)
        out[sid] += times.cell(cell)[0]
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
    times = CellTimes(exp, history or read_history(results_dir))
    estimates = config_estimates(exp, times)
    assignment = assign(
        server_ids=ids, pools=pools, estimates=estimates, previous=read_previous(paths.pools)
    )
    return PoolPlan(pools, assignment, estimates)


@dataclass(frozen=True)
class Plan:
    """What a run still has to do and how long it should take."""

    run_id: str
    total_cells: int
    missing: list[CellRepeat]
    starts: list[str]
    estimate_s: float
    from_history: int
    pools: PoolPlan
    pool_s: dict[int, float]  # estimated seconds of each pool's missing work

    def render(self) -> str:
        lines = [
            f"run {self.run_id}: {len(self.missing)} of {self.total_cells} cell-repeats missing",
            f"server starts: {len(self.starts)} ({', '.join(self.starts) or 'none'})",
            f"estimated wall time: {_duration(self.estimate_s)} "
            f"({self.from_history} of {len(self.missing)} cells timed from earlier runs, "
            f"the rest from the simulator's cost model)",
            f"node pools: {len(self.pools.pools)} (one server set at a time each)",
        ]
        for pool in self.pools.pools:
            servers = self.pools.servers(pool.index)
            lines.append(
                f"  pool {pool.index}: nodes {','.join(pool.nodes)}; {len(servers)} server "
                f"config(s), missing work {_duration(self.pool_s.get(pool.index, 0.0))}: "
                f"{' '.join(servers) or 'none'}"
            )
        for cell in self.missing:
            lines.append(f"  {cell.key} (pool {cell.server.pool})")
        return "\n".join(lines) + "\n"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def make_plan(*, exp: Experiment, paths: RunPaths, results_dir: Path) -> Plan:
    """The missing cell-repeats (no raw file yet), their server starts, their pools and the
    time estimate: the pools run at once, so the longest pool's work is the wall time."""
    history = read_history(results_dir)
    pools = pool_plan(exp=exp, paths=paths, results_dir=results_dir, history=history)
    cells = pooled_cells(exp, pools)
    missing = [c for c in cells if not paths.raw(c).exists()]
    times = CellTimes(exp, history)
    starts = list(dict.fromkeys(c.server.fingerprint for c in missing))
    pool_s: dict[int, float] = defaultdict(float)
    for cell in {c.server.fingerprint: c for c in missing}.values():
        pool_s[cell.server.pool] += times.start(cell.server.fingerprint)
    timed = 0
    for cell in missing:
        seconds, known = times.cell(cell)
        pool_s[cell.server.pool] += seconds
        timed += known
    estimate = max(pool_s.values(), default=0.0) + (ANALYSIS_S if missing else 0.0)
    return Plan(exp.run_id, len(cells), missing, starts, estimate, timed, pools, dict(pool_s))
