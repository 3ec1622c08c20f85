"""How every job resolves the workflow's config (light: the table and plot jobs import it
without the cell jobs' cluster modules)."""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from servesweep.config.experiment import Experiment
from servesweep.config.load import load_experiment
from servesweep.config.paths import RunPaths

PathLike = str | Path
F = TypeVar("F", bound=Callable[..., Any])


def per_job(func: F) -> F:
    """A function Snakemake calls for every job (run_cell's params and priority). Snakemake
    reads its signature at each call, two or three times (10k cells: ~150k times); stored as
    `__signature__`, inspect.signature returns it instead of rebuilding it, ~3x faster."""
    func.__signature__ = inspect.signature(func)  # type: ignore[attr-defined]
    return func


def experiment(config: Mapping[str, Any]) -> tuple[Experiment, RunPaths]:
    """The resolved experiment and its paths, exactly as the Snakefile resolved them."""
    exp = load_experiment(config, os.environ)
    return exp, RunPaths.for_run(exp)
