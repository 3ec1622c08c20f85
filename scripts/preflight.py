"""Adapter for rule preflight: checks before any server start, as evidence."""

from servesweep.workflow.jobs import preflight
from servesweep.workflow.logsetup import job_logging

if __name__ == "__main__":
    with job_logging(snakemake.log[0]):
        preflight(config=snakemake.config, out=snakemake.output.json)
