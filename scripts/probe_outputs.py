"""Adapter for rule probe_outputs: one server config's equivalence probe."""

from servesweep.workflow.jobs import probe_outputs
from servesweep.workflow.logsetup import job_logging

if __name__ == "__main__":
    with job_logging(snakemake.log[0]):
        probe_outputs(
            config=snakemake.config,
            server=snakemake.wildcards.server,
            fingerprint=snakemake.params.fingerprint,
            probe=snakemake.params.probe,
            out=snakemake.output.json,
        )
