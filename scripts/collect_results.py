"""Adapter for rule collect_results: results.csv and requests.csv from the cells' files."""

from servesweep.workflow.analysisjobs import collect_results
from servesweep.workflow.logsetup import job_logging

if __name__ == "__main__":
    with job_logging(snakemake.log[0]):
        collect_results(
            config=snakemake.config,
            cell_keys=snakemake.params.cells,
            raw=snakemake.input.raw,
            gpu=snakemake.input.gpu,
            results_csv=snakemake.output.csv,
            requests_csv=snakemake.output.requests,
            workers=snakemake.threads,
            equivalence=snakemake.input.equivalence,
        )
