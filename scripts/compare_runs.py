"""Adapter for rule compare_runs: run B vs run A per common cell, with intervals, verdicts.

The job is servesweep.jobs.compare_runs, run in a child of the workflow's fork server."""

from servesweep import forkserver

forkserver.run_job("servesweep.jobs:compare_runs", snakemake)
