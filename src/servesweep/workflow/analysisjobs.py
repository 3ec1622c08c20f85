"""The workflow's table jobs: results and requests tables, log scan, summary, case table,
manifest, cross-run comparison (see servesweep.workflow.jobs for how a job is called)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servesweep.core.errors import CellFailed
from servesweep.core.events import read_events
from servesweep.core.files import write_json_atomic, write_text_atomic

if TYPE_CHECKING:
    from servesweep.cluster.pools import PoolPlan
    from servesweep.config.paths import RunPaths
    from servesweep.workflow.jobconfig import PathLike

log = logging.getLogger(__name__)

# Each job imports the modules it uses in its function: a job's process pays for its own
# (collect_results neither the summary's nor the comparison's, the log scan no pandas, the
# summary and the log scan not the config's models: ~0.5 s of pydantic schemas).


def collect_results(
    *,
    config: Mapping[str, Any],
    cell_keys: Sequence[str],
    raw: Sequence[PathLike],
    gpu: Sequence[PathLike],
    results_csv: PathLike,
    requests_csv: PathLike,
    workers: int = 1,
    equivalence: Sequence[PathLike] = (),
) -> None:
    """Rule collect_results: results.csv (one row per cell-repeat) and requests.csv (one row
    per request) from the raw records and GPU snapshots of `cell_keys` (the selected cells and
    every other finished one of the configured matrix; `raw` and `gpu` in matrix order), read
    in `workers` processes (the rule's threads); with `equivalence` (equivalence.json), each
    row's `outputs_verdict`."""
    from servesweep.analysis.results import collect_results as collect
    from servesweep.analysis.results import write_requests_csv, write_results_csv
    from servesweep.cluster.pools import pooled_cells
    from servesweep.config.load import load_experiment, unnarrowed_env
    from servesweep.config.paths import aggregate_cells
    from servesweep.measure.provenance import CellParams
    from servesweep.workflow.jobconfig import experiment

    exp, paths = experiment(config)
    configured = load_experiment(config, unnarrowed_env(os.environ))
    cells = aggregate_cells(
        selected=pooled_cells(exp, planned_pools(exp, paths)),
        configured=pooled_cells(configured, planned_pools(configured, paths)),
        paths=paths,
    )
    if sorted(c.key for c in cells) != sorted(cell_keys):
        raise CellFailed(
            f"run {exp.run_id}: raw files appeared or vanished since the workflow planned "
            f"collect_results; run the workflow again"
        )
    params = CellParams(exp, {c.key: c for c in cells})
    results, requests = collect(
        run_id=exp.run_id,
        cells=cells,
        raw=[Path(p) for p in raw],
        gpu=[Path(p) for p in gpu],
        min_retokenized_ratio=exp.validation.min_retokenized_ratio,
        measured_with=[params.value(c.key) for c in cells],
        slo=exp.slo,
        saturation=exp.client.saturation,
        engine_kind=exp.engine.kind,
        time_scale=exp.engine.sim.time_scale,
        workers=workers,
        cluster=exp.cluster,
    )
    if equivalence:
        from servesweep.analysis.equivalence import row_verdict

        verdicts = json.loads(Path(equivalence[0]).read_text())
        results["outputs_verdict"] = [
            row_verdict(verdicts, row) for row in results.to_dict(orient="records")
        ]
    write_results_csv(results, results_csv)
    write_requests_csv(requests, requests_csv)


def planned_pools(exp: Any, paths: RunPaths) -> PoolPlan:
    """The pool plan the workflow ran with (its onstart wrote pools.json; kept from there)."""
    from servesweep.workflow.plan import pool_plan

    return pool_plan(exp=exp, paths=paths, results_dir=paths.root.parent)


def scan_logs(
    *, logs: Sequence[PathLike], service_root: PathLike, evidence: Mapping[str, str], out: PathLike
) -> None:
    """Rule scan_logs: final scan of every server log (fatal patterns, evidence)."""
    from servesweep.serving.logscan import scan_run

    write_json_atomic(out, scan_run(logs=logs, service_root=service_root, evidence=dict(evidence)))


def summarize(
    *,
    baseline: Mapping[str, Any],
    server_axes: Sequence[str],
    client_axes: Sequence[str],
    results_csv: PathLike,
    requests_csv: PathLike,
    logscan: PathLike,
    warmup: Sequence[PathLike],
    out: PathLike,
    workers: int = 1,
    equivalence: Sequence[PathLike] = (),
    gate: Sequence[Mapping[str, Any]] = (),
) -> None:
    """Rule summarize: medians, intervals, verdicts, final log scan, warm-ups and the `gate`'s
    bounds (config gate, as plain data); `baseline`, the axes and the gate are the rule's
    params (a changed one reruns it); the cells are resampled in `workers` processes (the
    rule's threads)."""
    from servesweep.analysis.summary import load_requests, warmups, write_summary
    from servesweep.analysis.summary import summarize as summarize_results
    from servesweep.analysis.tables import read_requests_csv, read_results_csv

    results = read_results_csv(results_csv)
    summary = summarize_results(
        results=results,
        baseline=dict(baseline),
        server_axes=list(server_axes),
        client_axes=list(client_axes),
        requests=load_requests(results=results, requests=read_requests_csv(requests_csv)),
        workers=workers,
    )
    scan = json.loads(Path(logscan).read_text())
    summary["log_scan"] = {k: v for k, v in scan.items() if k != "per_log"}
    summary["warmup"] = warmups(warmup)
    if gate:
        from servesweep.analysis.verdict import gate_result

        summary["gate"] = gate_result(summary["cells"], gate)
    if equivalence:
        from servesweep.analysis.equivalence import with_verdicts

        with_verdicts(summary, json.loads(Path(equivalence[0]).read_text()))
    write_summary(summary, out)


def compare_outputs(
    *, probes: Sequence[PathLike], baseline: Mapping[str, Any], tolerance: float, out: PathLike
) -> None:
    """Rule compare_outputs: each candidate server config's probe answers against its
    baseline's (analysis.equivalence) into equivalence.json."""
    from servesweep.analysis.equivalence import verdicts
    from servesweep.measure.probefile import answers_of

    result = verdicts(answers_of(probes), baseline=dict(baseline), tolerance=tolerance)
    for c in result["comparisons"]:
        log.info("%s vs %s: %s", c["candidate"], c["baseline"], c["verdict"])
    write_json_atomic(out, result)


def write_case_table(
    *,
    config: Mapping[str, Any],
    results_csv: PathLike,
    reference: Sequence[PathLike],
    md: PathLike,
    html: PathLike,
) -> None:
    """Rule write_case_table: the seed's PD table (markdown and HTML), and beside it each
    case against the reference table (`reference`: its file, or none)."""
    from servesweep.analysis.casetable import case_html, case_markdown, case_tables
    from servesweep.analysis.results import read_results_csv
    from servesweep.workflow.jobconfig import experiment

    exp, _ = experiment(config)
    tables = case_tables(exp=exp, results=read_results_csv(results_csv), reference=reference)
    write_text_atomic(md, case_markdown(tables))
    write_text_atomic(html, case_html(tables))


def write_landing_page(
    *,
    summary_json: PathLike,
    results_csv: PathLike,
    manifest_json: PathLike,
    builds: Sequence[PathLike],
    events: Sequence[PathLike],
    method: PathLike,
    metrics: Sequence[str],
    plots: Sequence[tuple[str, PathLike]],
    out: PathLike,
    validation: Sequence[PathLike] = (),
) -> None:
    """Rule write_landing_page: the report's first page (servesweep.analysis.landing); `events`: the
    run's orchestrator.log, if it has one; `plots`: (caption, PNG) of the key plots;
    `validation`: a case run's cases.html (its table against the reference), shown first."""
    from servesweep.analysis.landing import landing_page
    from servesweep.analysis.results import read_results_csv

    page = landing_page(
        summary=json.loads(Path(summary_json).read_text()),
        manifest=json.loads(Path(manifest_json).read_text()),
        results=read_results_csv(results_csv),
        metrics=list(metrics),
        plots=[(caption, Path(p)) for caption, p in plots],
        builds=[json.loads(Path(b).read_text()) for b in builds],
        events=[e for path in events for e in read_events(path)],
        method_rst=Path(method).read_text(),
        validation_html="".join(Path(p).read_text() for p in validation),
    )
    write_text_atomic(out, page)


def write_report(
    *,
    summary_json: PathLike,
    results_csv: PathLike,
    manifest_json: PathLike,
    builds: Sequence[PathLike],
    events: Sequence[PathLike],
    method: PathLike,
    metrics: Sequence[str],
    key_plots: Sequence[tuple[str, PathLike]],
    plots: Sequence[PathLike],
    tables: Sequence[PathLike],
    out: PathLike,
    validation: Sequence[PathLike] = (),
) -> None:
    """Rule write_report: report.html, the answer first (servesweep.analysis.htmlreport);
    `plots`: every plot of the run; `tables`: files the page links to (beside it);
    `validation`: a case run's cases.html, shown first."""
    from servesweep.analysis.htmlreport import report_html
    from servesweep.analysis.landing import answer_parts, image_figure
    from servesweep.analysis.results import read_results_csv

    summary = json.loads(Path(summary_json).read_text())
    manifest = json.loads(Path(manifest_json).read_text())
    answer = answer_parts(
        summary=summary,
        manifest=manifest,
        results=read_results_csv(results_csv),
        metrics=list(metrics),
        plots=[(caption, Path(p)) for caption, p in key_plots],
        builds=[json.loads(Path(b).read_text()) for b in builds],
        events=[e for path in events for e in read_events(path)],
        validation_html="".join(Path(p).read_text() for p in validation),
    )
    here = Path(out).parent
    page = report_html(
        run_id=str(manifest.get("run_id") or summary.get("run_id") or "?"),
        answer=answer,
        plots=[(Path(p).stem, image_figure(Path(p), Path(p).stem)) for p in plots],
        tables=[(Path(t).name, os.path.relpath(t, here)) for t in tables],
        method_rst=Path(method).read_text(),
    )
    write_text_atomic(out, page)


def write_manifest(
    *,
    config: Mapping[str, Any],
    server_info: Sequence[PathLike],
    builds: Sequence[PathLike],
    repo: PathLike,
    out: PathLike,
) -> None:
    """Rule write_manifest: resolved config, fingerprints, versions, image evidence."""
    from servesweep.cluster.owner import current_owner
    from servesweep.workflow.jobconfig import experiment
    from servesweep.workflow.manifest import build_manifest
    from servesweep.workflow.superseded import superseded_files

    exp, paths = experiment(config)
    manifest = build_manifest(
        exp=exp,
        server_info=[Path(p) for p in server_info],
        builds=[Path(p) for p in builds],
        repo=Path(repo),
        pools=planned_pools(exp, paths),
        superseded=superseded_files(paths),
        owner_tag=current_owner(paths.root.parent).tag,
    )
    write_json_atomic(out, manifest)


def compare_runs(
    *,
    run_a: str,
    run_b: str,
    results_a: PathLike,
    results_b: PathLike,
    requests_a: Sequence[PathLike],
    requests_b: Sequence[PathLike],
    out_json: PathLike,
    out_csv: PathLike,
    probes_a: Sequence[PathLike] = (),
    probes_b: Sequence[PathLike] = (),
    tolerance: float = 0.25,
) -> dict[str, Any]:
    """Rule compare_runs and `servesweep compare`: run B vs run A per common cell, with
    intervals, verdicts, written to `out_json` and `out_csv` and returned.
    `requests_*` hold the run's requests.csv, or nothing (compare.run_inputs); `probes_*` each
    run's equivalence answers: run B's answers of each server config against run A's
    (`outputs` in comparison.json)."""
    from servesweep.analysis import compare
    from servesweep.analysis.equivalence import across_runs
    from servesweep.measure.probefile import answers_of

    table_a, per_request_a = compare.load_run(
        results_csv=results_a, requests_csv=next(iter(requests_a), None)
    )
    table_b, per_request_b = compare.load_run(
        results_csv=results_b, requests_csv=next(iter(requests_b), None)
    )
    comparison = compare.compare_runs(
        results_a=table_a,
        results_b=table_b,
        run_a=run_a,
        run_b=run_b,
        requests_a=per_request_a,
        requests_b=per_request_b,
    )
    comparison["outputs"] = across_runs(
        answers_of(probes_a), answers_of(probes_b), tolerance=tolerance
    )
    compare.write_comparison(comparison, out_json)
    compare.write_table(compare.comparison_table(comparison), out_csv)
    return comparison
