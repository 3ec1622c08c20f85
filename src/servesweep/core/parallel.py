"""A list's contiguous chunks mapped in forked worker processes (the table jobs' cores)."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from servesweep.core.errors import WorkerDied

T = TypeVar("T")
R = TypeVar("R")

# Chunks per worker: contiguous chunks of about equal size balance uneven items well enough.
CHUNKS_PER_WORKER = 4
# Items per worker at least: a fork and the results' way back cost tens of ms, a record or a
# cell's resampling about 1-10 ms, so a small run stays in one process.
MIN_PER_WORKER = 64

# (fn, items) of the map in progress: forked workers inherit it, so neither is pickled.
_WORK: tuple[Callable[[Sequence[Any]], list[Any]], Sequence[Any]] | None = None


def usable_cores() -> int:
    """The CPUs this process may run on (its affinity, as Slurm or taskset set it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _run(start: int, stop: int) -> list[Any]:
    assert _WORK is not None
    fn, items = _WORK
    return fn(items[start:stop])


def map_chunks(
    fn: Callable[[Sequence[T]], list[R]],
    items: Sequence[T],
    *,
    workers: int,
    min_per_worker: int | None = None,
    what: str = "of a parallel map",
) -> list[R]:
    """fn(items[a:b]) for contiguous chunks of `items`, joined in order, in at most `workers`
    processes with at least `min_per_worker` (MIN_PER_WORKER) items each; fn(items) itself
    when that is one process, fork is unavailable, or a map is in progress.

    `fn` returns one result per item. Workers are forked, so `fn` and `items` reach them
    without pickling (closures welcome); results and exceptions come back pickled. A worker
    that dies (SIGKILL) raises WorkerDied naming `what` the pool was doing ("reading the raw
    records"), the other workers ended."""
    global _WORK
    n = len(items)
    least = MIN_PER_WORKER if min_per_worker is None else max(1, min_per_worker)
    workers = min(workers, n // least)
    if workers <= 1 or _WORK is not None or "fork" not in multiprocessing.get_all_start_methods():
        return fn(items)
    chunks = min(n, workers * CHUNKS_PER_WORKER)
    bounds = [n * i // chunks for i in range(chunks + 1)]
    _WORK = (fn, items)
    try:
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            parts = [pool.submit(_run, a, b) for a, b in zip(bounds, bounds[1:], strict=False)]
            return [r for part in parts for r in part.result()]
    except BrokenProcessPool:
        raise WorkerDied(
            f"a worker process {what} died (killed from outside: the OOM killer or "
            f"`kill -9`); nothing was written: rerun the same command"
        ) from None
    finally:
        _WORK = None
