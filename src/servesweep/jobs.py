"""The `script:` rules' jobs: one function per rule, given the rule's `snakemake` object.

`scripts/<rule>.py` hands its `snakemake` object to the function here through the fork server
(servesweep.forkserver), which has this module and what it imports loaded already. Each job
imports the modules it uses inside its function, so a job that arrives before the server has
preloaded them (the image checks, right at the start) does not wait for pandas and seaborn.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from servesweep import scripting
from servesweep.files import write_json_atomic, write_text_atomic

# What the fork server imports before it serves: the cell job, this module and snakemake.script,
# which unpickles the `snakemake` object a `script:` job hands over (named here, imported only
# by the fork server) ...
FIRST = ["servesweep.celljob", "servesweep.jobs", "snakemake.script"]
# ... and while it serves (servesweep.forkserver.serve): these jobs' modules.
THEN = [
    "servesweep.images",
    "servesweep.preflight",
    "servesweep.results",
    "servesweep.logscan",
    "servesweep.manifest",
    "servesweep.summary",
    "servesweep.casetable",
    "servesweep.plots",
    "servesweep.compare",
]


def _job(body: Callable[[Any], None]) -> Callable[[Any], None]:
    """A job's body, run as every script runs (scripting.run: one-line errors, exit codes)."""

    @functools.wraps(body)
    def job(smk: Any) -> None:
        scripting.run(lambda: body(smk))

    return job


@_job
def build_image(smk: Any) -> None:
    """Rule build_image: image + capability smoke evidence for one node."""
    from servesweep.images import build_image as build
    from servesweep.servers import connect

    exp, paths = scripting.experiment(smk)
    with connect(exp, paths) as manager:
        evidence = build(
            exp=exp, node=smk.wildcards.node, runtime=manager.runtime, log=Path(smk.log[0])
        )
    write_json_atomic(smk.output.json, evidence)


@_job
def preflight(smk: Any) -> None:
    """Rule preflight: checks before any server start, as evidence."""
    from servesweep.preflight import run_preflight
    from servesweep.servers import connect

    exp, paths = scripting.experiment(smk)
    with connect(exp, paths) as manager:
        evidence = run_preflight(exp=exp, manager=manager)
    write_json_atomic(smk.output.json, evidence)


@_job
def collect_results(smk: Any) -> None:
    """Rule collect_results: one row per cell-repeat."""
    from servesweep.config import cell_repeats
    from servesweep.results import collect_results as collect
    from servesweep.results import write_results_csv

    exp, paths = scripting.experiment(smk)
    write_results_csv(collect(cells=cell_repeats(exp), paths=paths), smk.output.csv)


@_job
def scan_logs(smk: Any) -> None:
    """Rule scan_logs: final scan of every server log (fatal patterns, evidence)."""
    from servesweep.logscan import scan_run

    exp, paths = scripting.experiment(smk)
    scan = scan_run(service_root=paths.root / "service", evidence=exp.evidence)
    write_json_atomic(smk.output.json, scan)


@_job
def summarize(smk: Any) -> None:
    """Rule summarize: medians, intervals, verdicts, final log scan and warm-ups."""
    from servesweep.config import axis_names
    from servesweep.results import read_results_csv
    from servesweep.summary import load_requests, warmups, write_summary
    from servesweep.summary import summarize as summarize_results

    exp, paths = scripting.experiment(smk)
    results = read_results_csv(smk.input.csv)
    # Per-request details come from the raw records results.csv was built from.
    requests = load_requests(results=results, run_dir=paths.root)
    server_axes, client_axes = axis_names(exp)
    summary = summarize_results(
        results=results,
        baseline=exp.baseline,
        server_axes=server_axes,
        client_axes=client_axes,
        requests=requests,
    )
    scan = json.loads(Path(smk.input.logscan).read_text())
    summary["log_scan"] = {k: v for k, v in scan.items() if k != "per_log"}
    summary["warmup"] = warmups(paths.root / "service")
    write_summary(summary, smk.output.json)


@_job
def write_case_table(smk: Any) -> None:
    """Rule write_case_table: the seed's PD table (markdown and HTML)."""
    from servesweep.casetable import case_table, markdown_table
    from servesweep.config import client_specs
    from servesweep.results import read_results_csv

    exp, _ = scripting.experiment(smk)
    table = case_table(results=read_results_csv(smk.input.csv), clients=client_specs(exp))
    note = ""
    if exp.engine.kind == "sim" and exp.engine.sim.time_scale > 0:
        scale = exp.engine.sim.time_scale
        note = (
            f"\nSimulated engine at time_scale {scale}: times are wall-clock; simulated "
            f"seconds = shown / {scale}, simulated TPS = shown x {scale}.\n"
        )
    write_text_atomic(smk.output.md, markdown_table(table) + note)
    write_text_atomic(smk.output.html, table.to_html(index=False, border=0))


@_job
def plot_results(smk: Any) -> None:
    """Rule plot_results: every figure of the run in one job."""
    from servesweep import plots
    from servesweep.results import read_results_csv
    from servesweep.summary import read_summary

    exp, _ = scripting.experiment(smk)
    hue, col = plots.series_axes(list(exp.matrix.server), exp.baseline)
    params, output = smk.params, smk.output
    plots.write_run_plots(
        summary=read_summary(smk.input.summary),
        results=read_results_csv(smk.input.csv),
        deltas=dict(zip(params.deltas, output.deltas, strict=True)),
        metric_vs=dict(zip(params.metric_vs, output.metric_vs, strict=True)),
        x=params.x,
        hue=hue,
        col=col,
    )


@_job
def write_manifest(smk: Any) -> None:
    """Rule write_manifest: resolved config, fingerprints, versions."""
    from servesweep.manifest import build_manifest

    exp, paths = scripting.experiment(smk)
    repo = Path(smk.scriptdir).parent
    write_json_atomic(smk.output.json, build_manifest(exp=exp, paths=paths, repo=repo))


@_job
def compare_runs(smk: Any) -> None:
    """Rule compare_runs: run B vs run A per common cell, with intervals, verdicts."""
    from servesweep import compare

    results_a, requests_a = compare.load_run(Path(smk.input.csv_a).parent)
    results_b, requests_b = compare.load_run(Path(smk.input.csv_b).parent)
    comparison = compare.compare_runs(
        results_a=results_a,
        results_b=results_b,
        run_a=smk.wildcards.run_a,
        run_b=smk.wildcards.run_b,
        requests_a=requests_a,
        requests_b=requests_b,
    )
    compare.write_comparison(comparison, smk.output.json)
    compare.write_table(compare.comparison_table(comparison), smk.output.csv)


@_job
def plot_comparison(smk: Any) -> None:
    """Rule plot_comparison: % change of run B vs run A per cell, one panel a metric."""
    from servesweep import plots

    comparison = json.loads(Path(smk.input.json).read_text())
    metrics = [m for m in smk.params.metrics if m in comparison["metrics"]]
    plots.save_figure(plots.plot_comparison(comparison, metrics=metrics or None), smk.output.png)


@_job
def plan(smk: Any) -> None:
    """Rule plan: print what is missing and how long it should take."""
    from servesweep.plan import make_plan

    exp, paths = scripting.experiment(smk)
    print(make_plan(exp=exp, paths=paths, results_dir=Path(paths.root).parent).render(), end="")


@_job
def down(smk: Any) -> None:
    """Rule down: stop every server of the run (after a hard kill)."""
    from servesweep.servers import shutdown

    exp, paths = scripting.experiment(smk)
    shutdown(exp, paths, reason="down rule")
