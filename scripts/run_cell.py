"""Adapter for rule run_cell: one cell-repeat, from its wildcards and params."""

from servesweep.workflow.jobs import run_cell
from servesweep.workflow.logsetup import job_logging

if __name__ == "__main__":
    with job_logging(snakemake.log.job):
        run_cell(
            config=snakemake.config,
            server=snakemake.wildcards.server,
            client=snakemake.wildcards.client,
            repeat=int(snakemake.wildcards.repeat),
            fingerprint=snakemake.params.fingerprint,
            workload=snakemake.params.workload,
            measured_with=snakemake.params.measured_with,
            raw=snakemake.output.raw,
            gpu=snakemake.output.gpu,
            metrics=snakemake.log.metrics,
            bench_log=snakemake.log.bench,
        )
