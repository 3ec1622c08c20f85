"""Adapter for rule compare_runs: run B vs run A per common cell, with intervals, verdicts."""

from servesweep.workflow.analysisjobs import compare_runs
from servesweep.workflow.logsetup import job_logging

if __name__ == "__main__":
    with job_logging(snakemake.log[0]):
        compare_runs(
            run_a=snakemake.wildcards.run_a,
            run_b=snakemake.wildcards.run_b,
            results_a=snakemake.input.csv_a,
            results_b=snakemake.input.csv_b,
            requests_a=snakemake.input.requests_a,
            requests_b=snakemake.input.requests_b,
            out_json=snakemake.output.json,
            out_csv=snakemake.output.csv,
            probes_a=snakemake.input.probes_a,
            probes_b=snakemake.input.probes_b,
            tolerance=snakemake.params.tolerance,
        )
