"""Adapter for rule summarize: medians, intervals, verdicts, final log scan and warm-ups."""

import json
from pathlib import Path

from servesweep import scripting
from servesweep.config import axis_names
from servesweep.results import read_results_csv
from servesweep.summary import load_requests, summarize, warmups, write_summary


def main() -> None:
    exp, paths = scripting.experiment(snakemake)
    results = read_results_csv(snakemake.input.csv)
    # Per-request details come from the raw records results.csv was built from.
    requests = load_requests(results=results, run_dir=paths.root)
    server_axes, client_axes = axis_names(exp)
    summary = summarize(
        results=results,
        baseline=exp.baseline,
        server_axes=server_axes,
        client_axes=client_axes,
        requests=requests,
    )
    scan = json.loads(Path(snakemake.input.logscan).read_text())
    summary["log_scan"] = {k: v for k, v in scan.items() if k != "per_log"}
    summary["warmup"] = warmups(paths.root / "service")
    write_summary(summary, snakemake.output.json)


scripting.run(main)
