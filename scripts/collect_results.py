"""Adapter for rule collect_results: one row per cell-repeat."""

from servesweep import scripting
from servesweep.config import cell_repeats
from servesweep.results import collect_results, write_results_csv


def main() -> None:
    exp, paths = scripting.experiment(snakemake)
    df = collect_results(cells=cell_repeats(exp), paths=paths)
    write_results_csv(df, snakemake.output.csv)


scripting.run(main)
