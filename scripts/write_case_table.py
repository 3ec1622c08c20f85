"""Adapter for rule write_case_table: the seed's PD table (markdown and HTML)."""

from servesweep.workflow.analysisjobs import write_case_table
from servesweep.workflow.logsetup import job_logging

if __name__ == "__main__":
    with job_logging(snakemake.log[0]):
        write_case_table(
            config=snakemake.config,
            results_csv=snakemake.input.csv,
            reference=snakemake.input.reference,
            md=snakemake.output.md,
            html=snakemake.output.html,
        )
