"""Adapter for rule compare_runs: run B vs run A per common cell, with intervals, verdicts."""

from pathlib import Path

from servesweep import compare, scripting


def main() -> None:
    run_a, run_b = snakemake.wildcards.run_a, snakemake.wildcards.run_b
    results_a, requests_a = compare.load_run(Path(snakemake.input.csv_a).parent)
    results_b, requests_b = compare.load_run(Path(snakemake.input.csv_b).parent)
    comparison = compare.compare_runs(
        results_a=results_a,
        results_b=results_b,
        run_a=run_a,
        run_b=run_b,
        requests_a=requests_a,
        requests_b=requests_b,
    )
    compare.write_comparison(comparison, snakemake.output.json)
    compare.write_table(compare.comparison_table(comparison), snakemake.output.csv)


scripting.run(main)
