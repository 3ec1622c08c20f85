"""Cells whose job process died without a word (SIGKILL: `kill -9`, the OOM killer).

Such a job runs no handler: no `servesweep:` line, no `cell-failed` event, its client may run
on and its hidden client file stays. Snakemake itself survives and runs `onerror`, which calls
`report_lost_cells` once every job has ended: it says so per cell, as the cell's job would have.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from servesweep.cluster.pools import narrow, node_pools
from servesweep.config.experiment import Experiment
from servesweep.config.matrix import CellRepeat
from servesweep.config.paths import RunPaths
from servesweep.core.errors import TransportError
from servesweep.core.events import EventLog, read_events
from servesweep.measure import isolation
from servesweep.measure.client import client_labels, remove_run_partials

logger = logging.getLogger(__name__)

KIND = "JobDied"
CAUSE = (
    "its job process ended without reporting why (killed by SIGKILL, e.g. `kill -9` or the OOM "
    "killer, when its job log ends without an error)"
)


def lost_cells(*, cells: Sequence[CellRepeat], paths: RunPaths, since: str) -> list[CellRepeat]:
    """Cells of `cells` whose last `cell-start` at or after `since` (this invocation's start,
    orchestrator.log's UTC stamp format) has no `cell-done` or `cell-failed` after it, and no
    raw file: their job ended without its handler running."""
    open_: dict[str, bool] = {}
    for stamp, event, fields in read_events(paths.orchestrator_log):
        if stamp < since:
            continue
        cell = fields.get("cell", "")
        if event == "cell-start":
            open_[cell] = True
        elif event in ("cell-done", "cell-failed"):
            open_.pop(cell, None)
    return [c for c in cells if c.key in open_ and not paths.raw(c).exists()]


def report_lost_cells(
    *, exp: Experiment, cells: Sequence[CellRepeat], paths: RunPaths, since: str
) -> list[str]:
    """For every lost cell (lost_cells): stop the client its job left (this run's, its pool's,
    by label), log `cell-failed`, remove the hidden client files killed jobs left; return one
    `servesweep: JobDied: ...` line per cell (naming the cell, the client's node, its logs)."""
    lost = lost_cells(cells=cells, paths=paths, since=since)
    if not lost:
        return []
    events = EventLog(paths.orchestrator_log)
    lines = []
    for pool in node_pools(exp):
        mine = [c for c in lost if c.server.pool == pool.index]
        if not mine:
            continue
        narrowed = narrow(exp, pool)
        node = narrowed.cluster.nodes[0]
        _stop_left_clients(exp=narrowed, paths=paths, pool=pool.index, cell=mine[0].key)
        for cell in mine:
            events.emit("cell-failed", cell=cell.key, fp=cell.server.fingerprint, error=CAUSE)
            lines.append(
                f"servesweep: {KIND}: cell {cell.key}: {CAUSE}; no record written; client on "
                f"node {node}; job log {paths.job_log(cell)}; bench log {paths.bench_log(cell)}"
            )
    remove_run_partials(paths.root, events=events)
    return lines


def _stop_left_clients(*, exp: Experiment, paths: RunPaths, pool: int, cell: str) -> None:
    """The killed job's client may run on (it is no child Snakemake waits for): stop it."""
    from servesweep.serving.servers import connect

    try:
        with connect(exp, paths, pool=pool) as manager:
            isolation.remove_stale_clients(
                runtime=manager.runtime,
                events=manager.events,
                node=exp.cluster.nodes[0],
                labels=client_labels(exp=exp, manager=manager),
                cell=cell,
            )
    except TransportError as exc:  # the node is gone too: the next run's cell removes it
        logger.warning("cell %s: could not stop the client its killed job left: %s", cell, exc)
