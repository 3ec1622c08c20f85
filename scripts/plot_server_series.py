"""Adapter for rule plot_server_series: the servers' load over each cell's measured window."""

from servesweep.workflow.logsetup import job_logging
from servesweep.workflow.plotjobs import plot_server_series

if __name__ == "__main__":
    with job_logging(snakemake.log[0]):
        plot_server_series(
            results_csv=snakemake.input.csv,
            metrics=snakemake.input.metrics,
            out=snakemake.output.png,
        )
