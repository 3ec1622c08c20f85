"""Glue for `scripts/<rule>.py`: load the experiment, log to the rule's log, one-line errors."""

from __future__ import annotations

import errno
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from servesweep.config import Experiment, RunPaths, load_experiment
from servesweep.errors import ServesweepError

logger = logging.getLogger(__name__)

INTERRUPTED = 130  # exit status of a process ended by SIGINT, as the shell reports it
# OSErrors that describe this host, not a bug: shown as one line like a ServesweepError.
HOST_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EMFILE}
)


def experiment(smk: Any) -> tuple[Experiment, RunPaths]:
    """The resolved experiment and its paths, exactly as the Snakefile resolved them."""
    exp = load_experiment(smk.config, os.environ)
    return exp, RunPaths.for_run(exp)


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
