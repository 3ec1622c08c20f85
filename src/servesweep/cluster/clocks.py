"""Each node's clock against the workflow host's: GPU samples carry the node's time, the
client's measured window the host's; a cell measures the offset to align them."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from servesweep.core.gpufile import PHASE_CLOCK, STATUS_OK, STATUS_UNAVAILABLE

if TYPE_CHECKING:
    from servesweep.cluster.transport import Transport

logger = logging.getLogger(__name__)

DATE_COMMAND = "date +%s.%N"


def offset_of(remote: str, *, before: float, after: float) -> float:
    """The node's clock minus this host's: its `date +%s.%N` output against the midpoint of
    the round trip (`before`, `after`: time.time() around it). ValueError if unreadable."""
    return float(remote.split()[-1]) - (before + after) / 2


def clock_rows(
    *, transport: Transport, nodes: Sequence[str], timeout: float = 30.0
) -> list[dict[str, Any]]:
    """One `clock` row per node for the GPU file: `clock_offset_s` (node minus workflow host,
    seconds), or `unavailable` with the reason."""
    rows = []
    for node in nodes:
        meta = {"node": node, "phase": PHASE_CLOCK}
        before = time.time()
        res = transport.run(node, DATE_COMMAND, timeout=timeout)
        after = time.time()
        try:
            offset = offset_of(res.stdout, before=before, after=after) if res.ok else None
        except (ValueError, IndexError):
            offset = None
        if offset is None:
            detail = f"cannot read the clock of node {node}: {(res.stderr or res.stdout)[:80]}"
            rows.append({**meta, "status": STATUS_UNAVAILABLE, "detail": detail})
            continue
        rows.append(
            {
                **meta,
                "status": STATUS_OK,
                "detail": f"node minus workflow host, {1000 * (after - before):.0f} ms round trip",
                "clock_offset_s": offset,
            }
        )
    return rows


def warn_offsets(rows: Sequence[dict[str, Any]], *, interval_s: float, cell: str) -> list[str]:
    """A warning per node whose offset exceeds the sampling interval (its samples would fall
    outside the window without alignment); returns the lines."""
    lines = []
    for row in rows:
        offset = row.get("clock_offset_s")
        if row.get("phase") == PHASE_CLOCK and offset is not None and abs(offset) > interval_s:
            lines.append(
                f"cell {cell}: node {row['node']}'s clock is {offset:+.3f} s off the workflow "
                f"host's, more than the GPU sampling interval ({interval_s:g} s); its samples "
                "are aligned by that offset (results.csv gpu_clock_offset_s, gpu_clock_skewed)"
            )
    for line in lines:
        logger.warning("%s", line)
    return lines
