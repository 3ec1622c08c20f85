"""Measured records a rerun replaces are kept, never deleted: raw/.superseded/<UTC time>/."""

from __future__ import annotations

import datetime as dt
import logging
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from servesweep.config.paths import CELL_FILES, RunPaths, cell_file
from servesweep.core.events import EventLog

logger = logging.getLogger(__name__)


def supersede(
    *,
    paths: RunPaths,
    cells: Sequence[tuple[str, str, int]],
    reasons: Mapping[tuple[str, str, int], str],
    events: EventLog,
    now: dt.datetime | None = None,
) -> list[Path]:
    """Before Snakemake reruns `cells` (server id, client id, repeat) and deletes their
    outputs: copy every file of each cell that has a raw record (record, GPU file, bench and
    job logs) to raw/.superseded/<UTC time>/ under its path in the run; an event per cell.
    Returns the raw records kept."""
    stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%dT%H%M%SZ")
    folder = paths.superseded / stamp
    kept = []
    for server, client, repeat in cells:
        ids = {"server_id": server, "client_id": client, "repeat": repeat}
        raw = cell_file(paths.root, "raw", **ids)
        if not raw.exists():
            continue
        for kind in CELL_FILES:
            src = cell_file(paths.root, kind, **ids)
            if src.exists():
                dst = folder / src.relative_to(paths.root)
                dst.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dst)  # mode and mtime kept; the rerun deletes the original
        kept.append(folder / raw.relative_to(paths.root))
        why = reasons.get((server, client, repeat), "rerun")
        cell = f"{server}/{client}/r{repeat}"
        events.emit("superseded", cell=cell, reason=why, kept=str(kept[-1]))
        logger.warning("cell %s: its record is replaced (%s); kept as %s", cell, why, kept[-1])
    return kept


def superseded_files(paths: RunPaths) -> list[str]:
    """Every record kept under raw/.superseded/, relative to the run folder (the manifest)."""
    return sorted(str(p.relative_to(paths.root)) for p in paths.superseded.glob("*/raw/**/*.jsonl"))
