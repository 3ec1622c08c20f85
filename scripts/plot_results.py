"""Adapter for rule plot_results: every figure of the run in one job."""

import json
from pathlib import Path

import pandas as pd

from servesweep import plots, scripting


def main() -> None:
    exp, _ = scripting.experiment(snakemake)
    hue, col = plots.series_axes(list(exp.matrix.server), exp.baseline)
    params, output = snakemake.params, snakemake.output
    plots.write_run_plots(
        summary=json.loads(Path(snakemake.input.summary).read_text()),
        results=pd.read_csv(snakemake.input.csv),
        deltas=dict(zip(params.deltas, output.deltas, strict=True)),
        metric_vs=dict(zip(params.metric_vs, output.metric_vs, strict=True)),
        x=params.x,
        hue=hue,
        col=col,
    )


scripting.run(main)
