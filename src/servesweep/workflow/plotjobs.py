"""The workflow's figure jobs: a run's plots, a comparison's plot (see servesweep.workflow.jobs)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from servesweep.analysis import plots
from servesweep.analysis.results import read_results_csv
from servesweep.analysis.summary import read_summary
from servesweep.workflow.jobconfig import PathLike, experiment


def plot_results(
    *,
    config: Mapping[str, Any],
    summary_json: PathLike,
    results_csv: PathLike,
    deltas: Mapping[str, PathLike],
    metric_vs: Mapping[str, PathLike],
    x: str | None,
    energy: Sequence[PathLike] = (),
    ttft: Sequence[PathLike] = (),
) -> None:
    """Rule plot_results: every figure of the run in one job (metric -> file); `energy`: the
    energy and goodput page's file, if the run has a client axis; `ttft`: a PD run's TTFT
    breakdown file."""
    exp, _ = experiment(config)
    hue, col = plots.series_axes(list(exp.matrix.server), exp.baseline)
    col = exp.plots.facet or col
    plots.write_run_plots(
        summary=read_summary(summary_json),
        results=read_results_csv(results_csv),
        deltas=dict(deltas),
        metric_vs=dict(metric_vs),
        x=x,
        hue=hue,
        col=col,
        energy=energy[0] if energy else None,
        ttft=ttft[0] if ttft else None,
    )


def plot_comparison(*, comparison_json: PathLike, metrics: Sequence[str], out: PathLike) -> None:
    """Rule plot_comparison: % change of run B vs run A per cell, one panel a metric."""
    comparison = json.loads(Path(comparison_json).read_text())
    shown = [m for m in metrics if m in comparison["metrics"]]
    plots.save_figure(plots.plot_comparison(comparison, metrics=shown or None), out)


def plot_server_series(
    *, results_csv: PathLike, metrics: Sequence[PathLike], out: PathLike
) -> None:
    """Rule plot_server_series: a panel per cell (its first repeat's /metrics series) of the
    servers' held requests and KV usage over the client's measured window."""
    results = read_results_csv(results_csv)
    plots.save_figure(plots.plot_server_series([Path(p) for p in metrics], results=results), out)
