"""Adapter for rule summarize: medians, intervals, verdicts, final log scan and warm-ups.

The job is servesweep.jobs.summarize, run in a child of the workflow's fork server."""

from servesweep import forkserver

forkserver.run_job("servesweep.jobs:summarize", snakemake)
