"""Adapter for rule plot_results: every figure of the run in one job.

The job is servesweep.jobs.plot_results, run in a child of the workflow's fork server."""

from servesweep import forkserver

forkserver.run_job("servesweep.jobs:plot_results", snakemake)
