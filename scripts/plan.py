"""Adapter for rule plan: print what is missing and how long it should take.

The job is servesweep.jobs.plan, run in a child of the workflow's fork server."""

from servesweep import forkserver

forkserver.run_job("servesweep.jobs:plan", snakemake)
