"""Adapter for rule write_manifest: resolved config, fingerprints, versions."""

from servesweep.workflow.analysisjobs import write_manifest
from servesweep.workflow.logsetup import job_logging

if __name__ == "__main__":
    with job_logging(snakemake.log[0]):
        write_manifest(
            config=snakemake.config,
            server_info=snakemake.input.server_info,
            builds=snakemake.input.builds,
            repo=snakemake.params.repo,
            out=snakemake.output.json,
        )
