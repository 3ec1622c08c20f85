"""Adapter for rule preflight: checks before any server start, as evidence.

The job is servesweep.jobs.preflight, run in a child of the workflow's fork server."""

from servesweep import forkserver

forkserver.run_job("servesweep.jobs:preflight", snakemake)
