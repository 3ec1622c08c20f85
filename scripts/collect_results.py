"""Adapter for rule collect_results: one row per cell-repeat.

The job is servesweep.jobs.collect_results, run in a child of the workflow's fork server."""

from servesweep import forkserver

forkserver.run_job("servesweep.jobs:collect_results", snakemake)
