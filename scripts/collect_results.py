"""Adapter for rule collect_results: one row per cell-repeat."""

from servesweep import analysis, scripting
from servesweep.config import cell_repeats


def main() -> None:
    exp, paths = scripting.experiment(snakemake)
    df = analysis.collect_results(cells=cell_repeats(exp), paths=paths)
    analysis.write_results_csv(df, snakemake.output.csv)


scripting.run(main)
