"""Adapter for rule scan_logs: final scan of every server log (fatal patterns, evidence)."""

from servesweep.workflow.analysisjobs import scan_logs
from servesweep.workflow.logsetup import job_logging

if __name__ == "__main__":
    with job_logging(snakemake.log[0]):
        scan_logs(
            logs=snakemake.input.logs,
            service_root=snakemake.params.service_root,
            evidence=snakemake.params.evidence,
            out=snakemake.output.json,
        )
