"""Adapter for rule build_image: image + capability smoke evidence for one node."""

from servesweep.jobs import build_image
from servesweep.logsetup import job_logging

if __name__ == "__main__":
    with job_logging(snakemake.log[0]):
        build_image(
            config=snakemake.config,
            node=snakemake.wildcards.node,
            log=snakemake.log[0],
            out=snakemake.output.json,
        )
