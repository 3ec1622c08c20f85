"""Adapter for rule plot_comparison: % change of run B vs run A per cell, one panel a metric.

The job is servesweep.jobs.plot_comparison, run in a child of the workflow's fork server."""

from servesweep import forkserver

forkserver.run_job("servesweep.jobs:plot_comparison", snakemake)
