"""Adapter for rule scan_logs: final scan of every server log (fatal patterns, evidence).

The job is servesweep.jobs.scan_logs, run in a child of the workflow's fork server."""

from servesweep import forkserver

forkserver.run_job("servesweep.jobs:scan_logs", snakemake)
