"""Adapter for rule build_images: base image, image, smoke and checks on every node at once."""

from servesweep.workflow.jobs import build_images
from servesweep.workflow.logsetup import job_logging

if __name__ == "__main__":
    with job_logging(snakemake.log.job):
        build_images(
            config=snakemake.config,
            logs=snakemake.log.nodes,
            out=snakemake.output.json,
        )
