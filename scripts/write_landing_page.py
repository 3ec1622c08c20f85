"""Adapter for rule write_landing_page: the report's first page."""

from servesweep.workflow.analysisjobs import write_landing_page
from servesweep.workflow.logsetup import job_logging

if __name__ == "__main__":
    with job_logging(snakemake.log[0]):
        write_landing_page(
            summary_json=snakemake.input.summary,
            results_csv=snakemake.input.csv,
            manifest_json=snakemake.input.manifest,
            builds=snakemake.input.builds,
            events=snakemake.input.events,
            method=snakemake.input.method,
            metrics=snakemake.params.metrics,
            plots=list(zip(snakemake.params.captions, snakemake.input.plots, strict=True)),
            validation=snakemake.input.validation,
            out=snakemake.output.rst,
        )
