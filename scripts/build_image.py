"""Adapter for rule build_image: image + capability smoke evidence for one node.

The job is servesweep.jobs.build_image, run in a child of the workflow's fork server."""

from servesweep import forkserver

forkserver.run_job("servesweep.jobs:build_image", snakemake)
