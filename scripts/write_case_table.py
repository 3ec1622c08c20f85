"""Adapter for rule write_case_table: the seed's PD table (markdown and HTML).

The job is servesweep.jobs.write_case_table, run in a child of the workflow's fork server."""

from servesweep import forkserver

forkserver.run_job("servesweep.jobs:write_case_table", snakemake)
