"""Adapter for rule down: stop every server of the run (after a hard kill).

The job is servesweep.jobs.down, run in a child of the workflow's fork server."""

from servesweep import forkserver

forkserver.run_job("servesweep.jobs:down", snakemake)
