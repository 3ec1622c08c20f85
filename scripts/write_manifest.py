"""Adapter for rule write_manifest.

The job is servesweep.jobs.write_manifest, run in a child of the workflow's fork server."""

from servesweep import forkserver

forkserver.run_job("servesweep.jobs:write_manifest", snakemake)
