"""`servesweep plan`: what is missing, how many server starts, and an estimated wall time.

Durations come from earlier runs' orchestrator.log where the same server config (fingerprint)
and client config ran before, else from the simulator's cost model run offline (no sleeping).
Nothing here touches a node.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from servesweep.config import CellRepeat, Experiment, cell_repeats
from servesweep.events import read_events
from servesweep.paths import RunPaths
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


@dataclass(frozen=True)
class Plan:
    """What a run still has to do and how long it should take."""

    run_id: str
    total_cells: int
    missing: list[CellRepeat]
    starts: list[str]
    estimate_s: float
    from_history: int

    def render(self) -> str:
        lines = [
            f"run {self.run_id}: {len(self.missing)} of {self.total_cells} cell-repeats missing",
            f"server starts: {len(self.starts)} ({', '.join(self.starts) or 'none'})",
            f"estimated wall time: {_duration(self.estimate_s)} "
            f"({self.from_history} of {len(self.missing)} cells timed from earlier runs, "
            f"the rest from the simulator's cost model)",
        ]
        for cell in self.missing:
            lines.append(f"  {cell.key}")
        return "\n".join(lines) + "\n"


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def make_plan(*, exp: Experiment, paths: RunPaths, results_dir: Path) -> Plan:
    """The missing cell-repeats (no raw file yet), their server starts and time estimate."""
    cells = cell_repeats(exp)
    missing = [c for c in cells if not paths.raw(c).exists()]
    history = read_history(results_dir)
    starts = list(dict.fromkeys(c.server.fingerprint for c in missing))
    estimate = sum(history.ready_s.get(fp, start_s(exp)) for fp in starts)
    timed = 0
    simulated: dict[tuple[str, str], float] = {}
    for cell in missing:
        key = (cell.server.fingerprint, cell.client.id)
        if key in history.cell_s:
            estimate += history.cell_s[key]
            timed += 1
        else:
            if key not in simulated:
                simulated[key] = simulated_cell_s(exp, cell)
            estimate += simulated[key]
        estimate += JOB_OVERHEAD_S
    if missing:
        estimate += ANALYSIS_S
    return Plan(exp.run_id, len(cells), missing, starts, estimate, timed)
