"""Adapter for rule preflight: checks before any server start, as evidence."""

from servesweep.jobs import preflight
from servesweep.logsetup import job_logging

if __name__ == "__main__":
    with job_logging(snakemake.log[0]):
        preflight(config=snakemake.config, out=snakemake.output.json)
