"""Adapter for rule write_report: report.html, the answer first."""

from servesweep.workflow.analysisjobs import write_report
from servesweep.workflow.logsetup import job_logging

if __name__ == "__main__":
    with job_logging(snakemake.log[0]):
        write_report(
            summary_json=snakemake.input.summary,
            results_csv=snakemake.input.csv,
            manifest_json=snakemake.input.manifest,
            builds=snakemake.input.builds,
            events=snakemake.input.events,
            method=snakemake.input.method,
            metrics=snakemake.params.metrics,
            key_plots=list(zip(snakemake.params.captions, snakemake.input.key_plots, strict=True)),
            plots=snakemake.input.plots,
            tables=snakemake.input.tables,
            validation=snakemake.input.validation,
            out=snakemake.output.html,
        )
