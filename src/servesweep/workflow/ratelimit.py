"""Snakemake's job-submission rate limiter, dropped for a local run (see docs/architecture.md)."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)


def unthrottle_scheduler(workflow: Any) -> bool:
    """Drop Snakemake's job-submission rate limiter (`--max-jobs-per-timespan`, default 100/1s,
    which the CLI cannot switch off) once the run's scheduler exists (`onstart:`); True if done.

    Snakemake 9 (up to 9.27 at least) re-arms a 1 s timer after every scheduling round while
    it is on, and each timer triggers another round: every finished job adds a chain that never
    ends while jobs are waiting. Here thousands of cells wait on their pool's resource, so
    after N cells N rounds a second, each costing O(pending jobs), keep Snakemake's main thread
    busy (benchmarks/large_run.py). With the local executor every job runs on this host, one
    cell at a time, so a submission rate limit has nothing to protect; with a cluster executor
    (`--executor slurm`) it protects the batch system and stays.

    This writes a Snakemake internal (no public setting does it): a Snakemake without the
    attribute gets a warning, and tests/unit/test_ratelimit.py fails on it.
    """
    if not getattr(workflow, "local_exec", False):
        return False
    scheduler = getattr(workflow, "scheduler", None)
    if not hasattr(scheduler, "job_rate_limiter"):
        logger.warning(
            "servesweep: this Snakemake has no scheduler.job_rate_limiter; its rate limiter "
            "(if any) stays on, which slows runs of thousands of cells (docs/architecture.md)"
        )
        return False
    scheduler.job_rate_limiter = None
    return True
