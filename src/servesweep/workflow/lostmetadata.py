"""Records measured with another configuration when Snakemake's metadata (.snakemake/) is gone.

Snakemake reruns a cell whose params changed only by comparing them with its metadata record
of the output; without one (`.snakemake/` deleted, a fresh checkout over old results) it sees
the raw file and reruns nothing. Each record carries what it was measured with
(provenance.KEY): for a raw file Snakemake has no record of, that copy is compared with the
current configuration, and a differing cell gets a marker file newer than its record as an input
of its job, so that Snakemake reruns it (its record is then superseded like any replaced one).
"""

from __future__ import annotations

import logging
import os
import time
from base64 import urlsafe_b64encode
from collections.abc import Mapping, Sequence
from pathlib import Path

from servesweep.config.experiment import Experiment
from servesweep.config.matrix import CellRepeat
from servesweep.config.paths import RunPaths
from servesweep.core.files import write_text_atomic
from servesweep.measure import provenance

logger = logging.getLogger(__name__)

METADATA_DIR = Path(".snakemake") / "metadata"


def metadata_path(output: str, metadata_dir: Path = METADATA_DIR) -> Path:
    """Where Snakemake's file persistence (9.x, snakemake/persistence/file.py) keeps its
    record of `output`: the urlsafe base64 of the path, split at the file-name limit."""
    try:
        max_len = os.pathconf(metadata_dir, "PC_NAME_MAX") or 255
    except OSError:
        max_len = 255
    b64 = urlsafe_b64encode(output.encode()).decode()
    parts = [b64[i : i + max_len - 1] for i in range(0, len(b64), max_len - 1)]
    return metadata_dir.joinpath(*["@" + p for p in parts[:-1]], parts[-1])


def marker(paths: RunPaths, cell: CellRepeat) -> Path:
    """The cell's marker: results/<run>/.changed/<server>/<client>/r<k>.txt."""
    return paths.root / ".changed" / f"{cell.key}.txt"


def changed_without_metadata(
    *,
    exp: Experiment,
    paths: RunPaths,
    cells: Sequence[CellRepeat],
    metadata_dir: Path = METADATA_DIR,
) -> dict[str, str]:
    """cell key -> marker path of each cell whose raw record Snakemake has no metadata of and
    that was measured with another configuration; the marker (the differences) is written
    newer than the record. Reads only those records (none while .snakemake/ is intact); the
    raw folder is listed once, so a fresh run's planning makes no call per cell."""
    found: dict[str, str] = {}
    present = paths.raw_files()
    if not present:
        return found
    for cell in cells:
        raw = paths.raw(cell)
        if str(raw) not in present or metadata_path(str(raw), metadata_dir).exists():
            continue
        try:
            recorded = provenance.recorded(raw)
        except (OSError, ValueError):  # unreadable: collect_results names it
            continue
        if not isinstance(recorded, Mapping):  # from before records carried it: nothing to test
            continue
        diff = provenance.differences(recorded, provenance.measured_with(exp, cell))
        if not diff:
            continue
        path = marker(paths, cell)
        write_text_atomic(path, "\n".join(diff) + "\n")
        stamp = max(time.time(), raw.stat().st_mtime + 1)
        os.utime(path, (stamp, stamp))
        found[cell.key] = str(path)
        logger.info("cell %s: measured with another configuration: %s", cell.key, diff[:3])
    return found
