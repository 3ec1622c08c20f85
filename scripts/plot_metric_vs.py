"""Adapter for rule plot_metric_vs: one metric against a client axis, per server config."""

import pandas as pd

from servesweep import plots, scripting


def main() -> None:
    exp, _ = scripting.experiment(snakemake)
    server_axes = list(exp.matrix.server)
    hue = next(iter(exp.baseline), server_axes[0] if server_axes else None)
    col = next((a for a in server_axes if a != hue), None)
    fig = plots.plot_metric_vs(
        pd.read_csv(snakemake.input.csv),
        metric=snakemake.wildcards.metric,
        x=snakemake.wildcards.x,
        hue=hue,
        col=col,
    )
    plots.save_figure(fig, snakemake.output.png)


scripting.run(main)
