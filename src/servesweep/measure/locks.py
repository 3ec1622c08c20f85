"""Locks of a run's jobs on the head: one cell at a time per node (across the runs of one
results root), and one live job per cell-repeat. Plain files under results/, held with flock
by the job that measures."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from servesweep.core.errors import CellFailed, RunLocked

logger = logging.getLogger(__name__)


def _open_lock(path: Path, cell: str) -> Any:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return path.open("a+")
    except OSError as exc:  # a full disk: name the file and the cell
        where = f"cell {cell}: " if cell else ""
        raise OSError(exc.errno, f"{where}cannot open {path}: {exc.strerror or exc}") from exc


@contextlib.contextmanager
def server_lock(
    paths: Path | Sequence[Path], *, cell: str = "", holder: str = ""
) -> Iterator[None]:
    """Hold the locks of the nodes a cell measures on (RunPaths.node_locks, one per node,
    taken in order) while it owns their servers: one cell at a time per node, across the runs
    of one results root and whatever Snakemake's `--cores` and `--resources` (the profile's
    `pool_<i>=1` keeps cells of a run from even starting meanwhile; this holds without it).
    `holder` ("<run> <pid>") is written into each lock file for `servesweep down` to read."""
    files = []
    try:
        for path in [paths] if isinstance(paths, Path) else list(paths):
            fh = _open_lock(path, cell)
            files.append(fh)
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.seek(0)
                other = fh.read().strip() or "another cell"
                logger.warning("waiting for %s: %s holds its node", path, other)
                fcntl.flock(fh, fcntl.LOCK_EX)
            fh.seek(0)
            fh.truncate()
            fh.write(holder)
            fh.flush()
        yield
    finally:
        for fh in reversed(files):
            fh.close()  # closing releases the lock


def lock_holder(path: Path) -> str | None:
    """What a live job that holds `path` wrote into it ("<run> <pid>"), else None."""
    try:
        with path.open("a+") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.seek(0)
                return fh.read().strip() or "?"
            fcntl.flock(fh, fcntl.LOCK_UN)
    except OSError:
        return None
    return None


@contextlib.contextmanager
def cell_lock(path: Path, *, cell: str) -> Iterator[None]:
    """Hold one cell-repeat's lock for the whole job; a second live job of the same cell (a run
    started again after `snakemake --unlock` while the first still runs) is refused at once
    rather than measuring the cell twice."""
    with _open_lock(path, cell) as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            other = fh.read().strip() or "another job"
            raise CellFailed(
                f"another live job is measuring it ({other}); two runs of one RUN_ID at once "
                f"(after `snakemake --unlock`?) would measure it twice",
                cell=cell,
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}")
        fh.flush()
        yield


def hold_run_lock(path: Path, *, run_id: str, holder: str) -> IO[str]:
    """Take the lock of run `run_id` for the calling process (Snakemake's own, from `onstart`):
    the returned file holds it until the process ends (not inherited by its jobs). A second
    live snakemake of the run raises RunLocked naming the first (`holder` as it wrote it), so
    it stops before it supersedes, stops or measures anything of the live one."""
    fh = _open_lock(path, "")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        other = fh.read().strip() or "another process"
        fh.close()
        raise RunLocked(
            f"run {run_id} is being measured by another live snakemake ({other}); this one "
            f"stops and touches nothing of it: wait for that one to end, or stop it first"
        ) from None
    fh.seek(0)
    fh.truncate()
    fh.write(holder)
    fh.flush()
    return fh
