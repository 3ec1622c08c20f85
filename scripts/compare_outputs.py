"""Adapter for rule compare_outputs: each candidate's answers against its baseline's."""

from servesweep.workflow.analysisjobs import compare_outputs
from servesweep.workflow.logsetup import job_logging

if __name__ == "__main__":
    with job_logging(snakemake.log[0]):
        compare_outputs(
            probes=snakemake.input.probes,
            baseline=snakemake.params.baseline,
            tolerance=snakemake.params.tolerance,
            out=snakemake.output.json,
        )
