"""Adapter for rule plot_deltas: % delta of one metric vs the baseline, per cell."""

import json
from pathlib import Path

from servesweep import plots, scripting


def main() -> None:
    summary = json.loads(Path(snakemake.input.json).read_text())
    fig = plots.plot_deltas(summary, metric=snakemake.wildcards.metric)
    plots.save_figure(fig, snakemake.output.png)


scripting.run(main)
