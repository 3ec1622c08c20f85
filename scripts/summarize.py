"""Adapter for rule summarize: medians, intervals, verdicts, final log scan and warm-ups."""

from servesweep.workflow.analysisjobs import summarize
from servesweep.workflow.logsetup import job_logging

if __name__ == "__main__":
    with job_logging(snakemake.log[0]):
        summarize(
            baseline=snakemake.params.baseline,
            server_axes=snakemake.params.server_axes,
            client_axes=snakemake.params.client_axes,
            results_csv=snakemake.input.csv,
            requests_csv=snakemake.input.requests,
            logscan=snakemake.input.logscan,
            warmup=snakemake.input.warmup,
            out=snakemake.output.json,
            workers=snakemake.threads,
            equivalence=snakemake.input.equivalence,
            gate=snakemake.params.gate,
        )
