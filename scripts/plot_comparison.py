"""Adapter for rule plot_comparison: % change of run B vs run A per cell, one panel a metric."""

from servesweep.workflow.logsetup import job_logging
from servesweep.workflow.plotjobs import plot_comparison

if __name__ == "__main__":
    with job_logging(snakemake.log[0]):
        plot_comparison(
            comparison_json=snakemake.input.json,
            metrics=snakemake.params.metrics,
            out=snakemake.output.png,
        )
