"""Glue for `scripts/<rule>.py`: load the experiment, log to the rule's log, one-line errors."""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from servesweep.config import Experiment, RunPaths, load_experiment
from servesweep.errors import ConfigError, ServesweepError

logger = logging.getLogger(__name__)

INTERRUPTED = 130  # exit status of a process ended by SIGINT, as the shell reports it
# OSErrors that describe this host, not a bug: shown as one line like a ServesweepError.
HOST_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EMFILE}
)


# The workflow's config as `shell:` jobs see it: inherited through the environment of the
# Snakemake process (nothing is written to disk or put on a command line).
WORKFLOW_CONFIG_ENV = "SERVESWEEP_WORKFLOW_CONFIG"


def _resolved(config: Mapping[str, Any]) -> tuple[Experiment, RunPaths]:
    exp = load_experiment(config, os.environ)
    return exp, RunPaths.for_run(exp)


def experiment(smk: Any) -> tuple[Experiment, RunPaths]:
    """The resolved experiment and its paths, exactly as the Snakefile resolved them."""
    return _resolved(smk.config)


def export_config(config: Mapping[str, Any]) -> None:
    """Hand the Snakefile's config to the `shell:` jobs it starts (see exported_experiment)."""
    os.environ[WORKFLOW_CONFIG_ENV] = json.dumps(config, default=str)


def exported_experiment() -> tuple[Experiment, RunPaths]:
    """`experiment()` for a `shell:` job: the config exported by the Snakefile, same env."""
    raw = os.environ.get(WORKFLOW_CONFIG_ENV)
    if raw is None:
        raise ConfigError(f"{WORKFLOW_CONFIG_ENV} is not set: run this job through snakemake")
    return _resolved(json.loads(raw))


def run(main: Callable[[], None]) -> None:
    """Run a script body; a ServesweepError or an OSError of this host (disk full, read-only,
    permission denied) becomes one line on stderr and exit status 1; Ctrl-C one line and 130."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        main()
    except ServesweepError as exc:
        print(f"servesweep: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
    except OSError as exc:
        if exc.errno not in HOST_ERRNOS:
            raise  # e.g. a missing file: a bug, keep its traceback
        logger.debug("traceback", exc_info=True)
        print(f"servesweep: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt as exc:
        print(f"servesweep: Interrupted: {exc or 'stopped by SIGINT (Ctrl-C)'}", file=sys.stderr)
        sys.exit(INTERRUPTED)


def unthrottle_scheduler(workflow: Any) -> None:
    """Drop Snakemake's job-submission rate limiter (`--max-jobs-per-timespan`, default
    100/1s, which the CLI cannot switch off) once the run's scheduler exists (`onstart:`).

    Snakemake 9 (up to 9.27 at least) re-arms a 1 s timer after every scheduling round while
    it is on, and each timer triggers another round: every finished job adds a chain that never
    ends while jobs are waiting. Here thousands of cells wait on the `gpu_server` resource, so
    after N cells N rounds a second, each costing O(pending jobs), keep Snakemake's main thread
    busy (benchmarks/large_run.py). Every job of this workflow is local and they run one at a
    time, so a submission rate limit has nothing to protect.
    """
    scheduler = getattr(workflow, "scheduler", None)
    if getattr(scheduler, "job_rate_limiter", None) is not None:
        scheduler.job_rate_limiter = None
