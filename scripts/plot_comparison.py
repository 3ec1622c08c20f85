"""Adapter for rule plot_comparison: % change of run B vs run A per cell, one panel a metric."""

import json
from pathlib import Path

from servesweep import plots, scripting


def main() -> None:
    comparison = json.loads(Path(snakemake.input.json).read_text())
    metrics = [m for m in snakemake.params.metrics if m in comparison["metrics"]]
    fig = plots.plot_comparison(comparison, metrics=metrics or None)
    plots.save_figure(fig, snakemake.output.png)


scripting.run(main)
