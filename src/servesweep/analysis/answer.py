"""The answer block a run prints last: per candidate, its change against the baseline, the
warnings that matter, and where the files are."""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from servesweep.analysis import equivalence as equivalence_verdicts
from servesweep.analysis import labels, stats
from servesweep.analysis.cautions import cautions, sim_noise
from servesweep.analysis.summary import SUMMARY_METRICS, cell_label
from servesweep.analysis.verdict import failures
from servesweep.config.experiment import Experiment

log = logging.getLogger(__name__)

# Cells listed per candidate; the report and summary.json have them all.
MAX_CELLS = 12


def change_text(metric: Mapping[str, Any]) -> str:
    """`-5.6% [-5.9, -4.4] better`: the change, its interval and the verdict."""
    change = labels.pct(metric.get("delta_pct"))
    low, high = metric.get("ci_low"), metric.get("ci_high")
    known = low is not None and high is not None
    interval = f" [{labels.pct(low)}, {labels.pct(high)}]" if known else ""
    return f"{change}%{interval} {metric.get('verdict') or stats.UNKNOWN}"


def primary_metrics(metrics: Sequence[str]) -> list[str]:
    """The first latency and the first throughput among `metrics` (config plots.metrics)."""
    picked = [
        next((m for m in metrics if SUMMARY_METRICS.get(m) == d), None) for d in ("lower", "higher")
    ]
    found = [m for m in picked if m]
    return found or list(metrics[:2])


def _candidates(
    deltas: Sequence[Mapping[str, Any]], axis: str | None
) -> dict[str, list[Mapping[str, Any]]]:
    """Deltas grouped by the candidate's value of the baseline axis, in summary order."""
    out: dict[str, list[Mapping[str, Any]]] = {}
    for delta in deltas:
        value = (delta.get("axes") or {}).get(axis) if axis else None
        out.setdefault(str(value), []).append(delta)
    return out


def _table(rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in rows
    ]


def warnings(
    *, summary: Mapping[str, Any], results: pd.DataFrame, events: Sequence[tuple[str, str, Any]]
) -> list[str]:
    """The warnings a user must see before trusting the answer (analysis.cautions: the same
    sentences as the report's)."""
    return cautions(summary=summary, results=results, events=events)


def verdict_lines(summary: Mapping[str, Any]) -> list[str]:
    """The validation's failures (analysis.verdict), one line each, and the gate's count."""
    failed = failures(summary)
    gate = summary.get("gate")
    lines = ["Validation FAILED:", *(f"  - {f}" for f in failed)] if failed else []
    if gate and not gate.get("missed"):
        lines.append(f"Gate: all {gate.get('checked')} bounds met (summary.json gate).")
    return lines


def answer_block(
    *,
    summary: Mapping[str, Any],
    results: pd.DataFrame,
    metrics: Sequence[str],
    files: Sequence[tuple[str, str]],
    events: Sequence[tuple[str, str, Any]] = (),
    cases: Sequence[str] = (),
) -> str:
    """The run's answer as console text: a case run's `cases` lines (each case against the
    reference, analysis.casetable.case_lines); per candidate against its baseline, the change
    and interval of the primary metrics per cell and the verdict counts over every compared
    metric; the warnings that matter; `files` as (name, path)."""
    run_id = summary.get("run_id") or "?"
    sim = labels.sim_note(summary.get("engine") or {})
    lines = [f"== servesweep: the answer of run {run_id}" + (f" ({sim})" if sim else "")]
    baseline = dict(summary.get("baseline") or {})
    axis = next(iter(baseline), None)
    deltas = summary.get("deltas") or []
    primary = primary_metrics(metrics)
    lines += cases
    if not deltas and not cases:
        why = summary.get("note") or "no candidate cell has a baseline twin"
        lines.append(f"No deltas: {why}. Medians per cell are in summary.json and the report.")
    for value, group in _candidates(deltas, axis).items():
        n = sorted({d.get("n_candidate") for d in group} | {d.get("n_baseline") for d in group})
        lines.append(
            f"{axis}={value} vs baseline {axis}={baseline.get(axis)}: {len(group)} cells, "
            f"medians of {'/'.join(str(x) for x in n)} repeats"
        )
        rows = [["cell", *(labels.label(m) for m in primary)]]
        for delta in group[:MAX_CELLS]:
            axes = {k: v for k, v in (delta.get("axes") or {}).items() if k != axis}
            rows.append(
                [
                    cell_label(axes) or str(delta.get("label")),
                    *(change_text((delta.get("metrics") or {}).get(m) or {}) for m in primary),
                ]
            )
        lines += _table(rows)
        if len(group) > MAX_CELLS:
            lines.append(f"  ... and {len(group) - MAX_CELLS} more cells (summary.json)")
        verdicts = Counter(
            m.get("verdict") or stats.UNKNOWN
            for d in group
            for m in (d.get("metrics") or {}).values()
        )
        counted = ", ".join(f"{verdicts[v]} {v}" for v in stats.VERDICTS if verdicts[v])
        total = sum(verdicts.values())
        lines.append(f"  verdicts over {total} cell-metric comparisons: {counted or 'none'}")
        lines += _outputs_lines(summary.get("equivalence"), axis=axis, value=value)
    lines += verdict_lines(summary)
    found = warnings(summary=summary, results=results, events=events)
    lines.append("Warnings:" + ("" if found else " none"))
    lines += [f"  - {w}" for w in found]
    noise = sim_noise(summary)
    lines += [f"  ({noise})"] if noise else []
    width = max(len(name) for name, _ in files) if files else 0
    lines.append("Files:")
    lines += [f"  {name.ljust(width)}  {path}" for name, path in files]
    return "\n".join(lines) + "\n"


def comparison_block(
    comparison: Mapping[str, Any], *, metrics: Sequence[str], files: Sequence[tuple[str, str]]
) -> str:
    """Run B against run A (analysis.compare) as console text: per common cell the change of
    B vs A, its interval and verdict for the primary metrics; the verdict counts over every
    compared metric, and per metric where any is not `within noise`; the equivalence probe's
    verdict per server config both runs probed; the cells only one run has; `files` as
    (name, path)."""
    run_a, run_b = comparison.get("run_a") or "A", comparison.get("run_b") or "B"
    cells = comparison.get("cells") or []
    lines = [
        f"== servesweep: run {run_b} against run {run_a}: {len(cells)} cells in common "
        f"(matched by {comparison.get('matched_by')}); change = (B - A) / A of the medians, "
        "`better`: B is better"
    ]
    if comparison.get("note"):
        lines.append(f"Note: {comparison['note']}.")
    compared = list(comparison.get("metrics") or {})
    primary = [m for m in primary_metrics(metrics) if m in compared] or primary_metrics(compared)
    if cells and primary:
        rows = [["cell", *(labels.label(m) for m in primary)]]
        for cell in cells[:MAX_CELLS]:
            found = cell.get("metrics") or {}
            rows.append(
                [str(cell.get("label")), *(change_text(found.get(m) or {}) for m in primary)]
            )
        lines += _table(rows)
        if len(cells) > MAX_CELLS:
            lines.append(f"  ... and {len(cells) - MAX_CELLS} more cells (comparison.csv)")
    counts = comparison.get("verdict_counts") or {}
    total = Counter({v: sum(c.get(v, 0) for c in counts.values()) for v in stats.VERDICTS})
    counted = ", ".join(f"{total[v]} {v}" for v in stats.VERDICTS if total[v])
    lines.append(
        f"  verdicts over {sum(total.values())} cell-metric comparisons: {counted or 'none'}"
    )
    for metric, found in counts.items():  # the metrics that changed: each with its counts
        changed = [f"{found[v]} {v}" for v in stats.VERDICTS if found.get(v) and v != stats.NOISE]
        if changed:
            lines.append(f"    {labels.label(metric)}: {', '.join(changed)}")
    outputs = comparison.get("outputs") or []
    if outputs:
        lines.append(f"Outputs (equivalence probe, run {run_b}'s answers against run {run_a}'s):")
        lines += [f"  {c.get('baseline')}: {_probe_line(c)}" for c in outputs]
    else:
        lines.append("Outputs: not compared (no server config probed in both runs)")
    for side, run in (("a", run_a), ("b", run_b)):
        only = comparison.get(f"only_in_{side}") or []
        if only:
            named = ", ".join(f"{c['server_id']}/{c['client_id']}" for c in only[:3])
            more = f" and {len(only) - 3} more" if len(only) > 3 else ""
            lines.append(f"Only in run {run}: {len(only)} cells ({named}{more})")
    width = max(len(name) for name, _ in files) if files else 0
    lines.append("Files:")
    lines += [f"  {name.ljust(width)}  {path}" for name, path in files]
    return "\n".join(lines) + "\n"


def print_comparison(*, comparison_json: str | Path, metrics: Sequence[str]) -> str:
    """The comparison block of a comparison.json (`servesweep compare`, the workflow's compare
    target), with the comparison's files that exist; printed and returned."""
    from servesweep.analysis.summary import read_summary

    folder = Path(comparison_json).parent
    names = ("comparison.json", "comparison.csv", "comparison.png")
    files = [(n, str(folder / n)) for n in names if (folder / n).exists()]
    text = comparison_block(read_summary(comparison_json), metrics=metrics, files=files)
    print(text, end="", flush=True)
    return text


def _probe_line(comparison: Mapping[str, Any]) -> str:
    """An equivalence comparison's one line (analysis.equivalence.Comparison.line)."""
    names = {f.name for f in dataclasses.fields(equivalence_verdicts.Comparison)}
    fields = {k: v for k, v in comparison.items() if k in names and k != "per_prompt"}
    return equivalence_verdicts.Comparison(**fields).line()


def newer_record(*, outputs: Sequence[str | Path], records: Sequence[str | Path]) -> Path | None:
    """The newest of `records` (raw records) that is newer than the oldest of `outputs`
    (results.csv, summary.json): an answer built from them would be stale. None: current."""
    built = min(Path(p).stat().st_mtime_ns for p in outputs)
    newest: tuple[int, Path] | None = None
    for record in map(Path, records):
        try:
            stamp = record.stat().st_mtime_ns
        except FileNotFoundError:
            continue
        if stamp > built and (newest is None or stamp > newest[0]):
            newest = (stamp, record)
    return newest[1] if newest else None


def print_answer(
    *,
    summary_json: str | Path,
    results_csv: str | Path,
    report_html: str | Path,
    metrics: Sequence[str],
    events: str | Path | None = None,
    records: Sequence[str | Path] = (),
    refresh: str = "snakemake --cores 1 all",
    exp: Experiment | None = None,
    cases: Sequence[str | Path] = (),
    reference: Sequence[str | Path] = (),
) -> str:
    """The answer block of a finished run from its files (the workflow's `onsuccess`), printed
    and returned. One line instead where there is no answer to trust: no summary yet (a single
    cell targeted on a fresh run), or results.csv/summary.json older than one of `records`
    (the raw records they are built from: a cell rerun alone); both name `refresh`, the
    command that brings them up to date. A case run (`exp` with cases) also shows each case
    against its `reference` file, and lists its `cases` files (cases.md, cases.html)."""
    from servesweep.analysis.casetable import case_lines, case_tables
    from servesweep.analysis.results import read_results_csv
    from servesweep.analysis.summary import read_summary
    from servesweep.core.events import read_events

    files = [
        ("results.csv", str(results_csv)),
        ("summary.json", str(summary_json)),
        *((Path(p).name, str(p)) for p in cases),
        ("console", str(Path(summary_json).parent / "console.log")),
        ("report", str(report_html)),  # last: the page to open
    ]
    if not Path(summary_json).exists() or not Path(results_csv).exists():
        text = f"servesweep: no summary yet; `{refresh}` writes " + ", ".join(p for _, p in files)
        print(text, flush=True)
        return text
    newer = newer_record(outputs=[summary_json, results_csv], records=records)
    if newer is not None:
        text = (
            f"servesweep: no answer printed: {summary_json} and {results_csv} are older than the "
            f"raw record {newer} (a cell ran without the analysis after it); `{refresh}` brings "
            "them and the report up to date and prints the answer"
        )
        print(text, flush=True)
        return text
    results = read_results_csv(results_csv)
    shown: list[str] = []
    if exp is not None and exp.cases:
        shown = case_lines(case_tables(exp=exp, results=results, reference=reference))
    text = answer_block(
        summary=read_summary(summary_json),
        results=results,
        metrics=metrics,
        files=[(n, p) for n, p in files if Path(p).exists()],
        events=read_events(events) if events else [],
        cases=shown,
    )
    print(text, end="", flush=True)
    return text


def _outputs_lines(
    equivalence: Mapping[str, Any] | None, *, axis: str | None, value: str
) -> list[str]:
    """The equivalence verdicts of a candidate's server configs, under its speed verdicts:
    `outputs differ` as a warning no reader can miss (a faster candidate that differs is not
    better)."""
    found = [
        c
        for c in (equivalence or {}).get("comparisons") or []
        if axis and str((c.get("candidate_axes") or {}).get(axis)) == value
    ]
    if not found:
        return []
    differ = [c for c in found if c.get("verdict") == equivalence_verdicts.DIFFER]
    if differ:
        return [
            f"  !! WARNING: outputs differ from the baseline in {len(differ)} of {len(found)} "
            "server config(s): the speed verdicts above do not make it better (equivalence.json)"
        ]
    kinds = sorted({str(c.get("verdict")) for c in found})
    return [f"  outputs vs baseline: {', '.join(kinds)} ({len(found)} server config(s) probed)"]
