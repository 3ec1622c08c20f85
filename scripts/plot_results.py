"""Adapter for rule plot_results: every figure of the run in one job."""

from servesweep.workflow.logsetup import job_logging
from servesweep.workflow.plotjobs import plot_results

if __name__ == "__main__":
    with job_logging(snakemake.log[0]):
        plot_results(
            config=snakemake.config,
            summary_json=snakemake.input.summary,
            results_csv=snakemake.input.csv,
            deltas=dict(zip(snakemake.params.deltas, snakemake.output.deltas, strict=True)),
            metric_vs=dict(
                zip(snakemake.params.metric_vs, snakemake.output.metric_vs, strict=True)
            ),
            x=snakemake.params.x,
            energy=snakemake.output.energy,
            ttft=snakemake.output.ttft,
        )
