"""Adapter for rule plot_results: every figure of the run in one job."""

from servesweep import plots, scripting
from servesweep.results import read_results_csv
from servesweep.summary import read_summary


def main() -> None:
    exp, _ = scripting.experiment(snakemake)
    hue, col = plots.series_axes(list(exp.matrix.server), exp.baseline)
    params, output = snakemake.params, snakemake.output
    plots.write_run_plots(
        summary=read_summary(snakemake.input.summary),
        results=read_results_csv(snakemake.input.csv),
        deltas=dict(zip(params.deltas, output.deltas, strict=True)),
        metric_vs=dict(zip(params.metric_vs, output.metric_vs, strict=True)),
        x=params.x,
        hue=hue,
        col=col,
    )


scripting.run(main)
