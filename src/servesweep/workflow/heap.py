"""The Snakemake process's garbage collector, tuned for DAGs of thousands of jobs.

A dry-run of 10k cell-repeats grows Snakemake's heap to ~400 MB of long-lived objects (jobs,
files, wildcards) with few reference cycles. With CPython's default thresholds (700, 10, 10)
the collector runs a full collection each time the long-lived objects grew by a quarter,
15 of them in that dry-run, each walking the whole heap: 19% of its time (benchmarks/planning.py,
docs/performance.md). Fewer young collections and a full one only every 100 middle-aged
ones keep the same peak memory and spend ~1 s.
"""

from __future__ import annotations

import gc

# (young, middle-aged, full): allocations between young collections, and how many of each
# generation's collections between collections of the next.
THRESHOLDS = (10_000, 10, 100)


def collect_less_often() -> tuple[int, int, int]:
    """Set THRESHOLDS in this process (the Snakefile calls it while parsing); the previous
    thresholds."""
    previous = gc.get_threshold()
    gc.set_threshold(*THRESHOLDS)
    return previous
