"""How every job resolves the workflow's config (light: the table and plot jobs import it
without the cell jobs' cluster modules)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servesweep.config.experiment import Experiment
from servesweep.config.load import load_experiment
from servesweep.config.paths import RunPaths

PathLike = str | Path


def experiment(config: Mapping[str, Any]) -> tuple[Experiment, RunPaths]:
    """The resolved experiment and its paths, exactly as the Snakefile resolved them."""
    exp = load_experiment(config, os.environ)
    return exp, RunPaths.for_run(exp)
