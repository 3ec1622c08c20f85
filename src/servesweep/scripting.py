"""Glue for `scripts/<rule>.py`: load the experiment, log to the rule's log, one-line errors."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from servesweep.config import Experiment, RunPaths, load_experiment
from servesweep.errors import ServesweepError


def experiment(smk: Any) -> tuple[Experiment, RunPaths]:
    """The resolved experiment and its paths, exactly as the Snakefile resolved them."""
    exp = load_experiment(smk.config, os.environ)
    return exp, RunPaths.for_run(exp)


def run(main: Callable[[], None]) -> None:
    """Run a script body; a ServesweepError becomes one line on stderr and exit status 1."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    try:
        main()
    except ServesweepError as exc:
        print(f"servesweep: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)
