"""Adapter for rule summarize: medians over repeats, deltas vs the baseline."""

import pandas as pd

from servesweep import analysis, scripting


def main() -> None:
    exp, _ = scripting.experiment(snakemake)
    summary = analysis.summarize(
        results=pd.read_csv(snakemake.input.csv),
        baseline=exp.baseline,
        server_axes=list(exp.matrix.server),
        client_axes=list(exp.matrix.client),
    )
    analysis.write_summary(summary, snakemake.output.json)


scripting.run(main)
