"""Adapter for rule summarize: medians, bootstrap intervals and verdicts vs the baseline."""

from servesweep import analysis, scripting


def main() -> None:
    exp, paths = scripting.experiment(snakemake)
    results = analysis.read_results_csv(snakemake.input.csv)
    # Per-request details come from the raw records next to results.csv (rule input `raw`).
    requests = analysis.load_requests(results=results, run_dir=paths.root)
    summary = analysis.summarize(
        results=results,
        baseline=exp.baseline,
        server_axes=list(exp.matrix.server),
        client_axes=list(exp.matrix.client),
        requests=requests,
    )
    analysis.write_summary(summary, snakemake.output.json)


scripting.run(main)
