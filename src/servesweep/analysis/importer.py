"""`servesweep import`: a folder of bench_serving JSONL files as a run of results/<run_id>/."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from servesweep.analysis import figures, stats
from servesweep.analysis.gpufigures import gpu_figures
from servesweep.analysis.results import (
    INTEGER_METRICS,
    TAIL_COLUMNS,
    engine_figures,
    record_metrics,
    request_table,
    result_columns,
    significant,
    write_requests_csv,
    write_results_csv,
)
from servesweep.analysis.summary import load_requests, summarize, write_summary
from servesweep.config.matrix import segment
from servesweep.config.paths import cell_file
from servesweep.config.schema import MIN_RETOKENIZED_RATIO, NAME_PATTERN
from servesweep.core.bounds import loads_json
from servesweep.core.files import strict_json, write_json_atomic, write_text_atomic
from servesweep.core.names import safe_segment
from servesweep.measure.checks import CheckInputError
from servesweep.measure.records import BenchRecord
from servesweep.measure.validation import judge_record

log = logging.getLogger(__name__)

IMPORTED_FINGERPRINT = "imported"
PLOT_METRICS = ("ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "input_tps")  # as the workflow's


class RecordField(BaseModel):
    """An axis read from a record key (e.g. `max_concurrency`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    record: str


class Mapping(BaseModel):
    """Which files to import and how each names its axes and repeat (docs/validation.md).

    An axis is a regular expression with one group, searched in the file's path relative to
    the folder, or `{record: <key>}`. Without `repeat` each cell's records are numbered in
    path order (and line order within a file).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    files: str = "**/*.jsonl"
    server: dict[str, str | RecordField] = Field(default_factory=dict)
    client: dict[str, str | RecordField] = Field(
        default_factory=lambda: {"concurrency": RecordField(record="max_concurrency")}
    )
    repeat: str | None = None
    baseline: dict[str, Any] = Field(default_factory=dict)

    @field_validator("server", "client")
    @classmethod
    def _regexes(cls, axes: dict[str, str | RecordField]) -> dict[str, str | RecordField]:
        for name, rule in axes.items():
            if isinstance(rule, str):
                _compile(rule, what=f"axis {name}")
        return axes

    @field_validator("repeat")
    @classmethod
    def _repeat(cls, rule: str | None) -> str | None:
        if rule is not None:
            _compile(rule, what="repeat")
        return rule


def _compile(rule: str, *, what: str) -> re.Pattern[str]:
    try:
        rx = re.compile(rule)
    except re.error as exc:
        raise ValueError(f"{what}: bad regular expression: {exc}") from None
    if rx.groups != 1:
        raise ValueError(f"{what}: the regular expression needs exactly one group")
    return rx


def load_mapping(path: str | Path) -> Mapping:
    """The mapping YAML; CheckInputError names the file and the key."""
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
        return Mapping.model_validate(raw)
    except OSError as exc:
        raise CheckInputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise CheckInputError(f"{path}: not YAML: {str(exc).splitlines()[0]}") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"])
        raise CheckInputError(f"{path}: mapping key '{key}': {err['msg']}") from None


@dataclass
class ImportReport:
    """What an import took and what it refused (one line each)."""

    run_dir: Path
    imported: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"rejected {r}" for r in self.rejected]
        out += [f"warning {w}" for w in self.warnings]
        out.append(
            f"imported {len(self.imported)} record(s) into {self.run_dir}"
            f" ({len(self.rejected)} rejected)"
        )
        return out


def _value(text: Any) -> Any:
    if isinstance(text, str) and re.fullmatch(r"-?\d+", text):
        return int(text)
    if isinstance(text, str) and re.fullmatch(r"-?\d+\.\d*", text):
        return float(text)
    return text


def _axes(rules: dict[str, str | RecordField], *, rel: str, data: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, rule in rules.items():
        if isinstance(rule, RecordField):
            if data.get(rule.record) is None:
                raise ValueError(f"axis {name}: record has no {rule.record}")
            out[name] = _value(data[rule.record])
        else:
            match = re.search(rule, rel)
            if match is None:
                raise ValueError(f"axis {name}: {rule!r} does not match the path")
            out[name] = _value(match.group(1))
    return out


def merged_files(
    cells: dict[tuple[str, str], list[dict[str, Any]]], *, mapping: Mapping
) -> list[str]:
    """One warning per cell whose records come from more than one file: they are taken as
    repeats of one configuration, which is wrong when the files hold different ones (without
    --mapping every record of one concurrency is one cell)."""
    out = []
    for (server_id, client_id), entries in cells.items():
        files = sorted({e["file"] for e in entries})
        if len(files) < 2 or mapping.repeat is not None:
            continue
        shown = ", ".join(files[:3]) + (", ..." if len(files) > 3 else "")
        axes = "--mapping gave no server axis" if not mapping.server else "same server axes"
        out.append(
            f"cell {server_id}/{client_id}: {len(files)} files treated as repeats of one cell "
            f"({shown}; {axes}); if they hold different configurations, map an axis from "
            "the path or a record field (--mapping)"
        )
    return out


def _records(path: Path) -> list[tuple[int, str]]:
    return [(n, line) for n, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]


def import_run(
    *,
    source: Path,
    run_id: str,
    results: Path,
    mapping: Mapping,
    min_retokenized_ratio: float = MIN_RETOKENIZED_RATIO,
    plots: bool = True,
) -> ImportReport:
    """Copy every valid record of `source` to results/<run_id>/raw/<server>/<client>/r<k>.jsonl
    and write results.csv, summary.json and (with `plots`) the run's plots from them.

    Invalid or unmappable records are reported and left out, never silently included.
    """
    if not re.fullmatch(NAME_PATTERN.strip("^$"), run_id):
        raise CheckInputError(f"--run-id {run_id!r}: letters, digits, '.', '_', '-'")
    if not source.is_dir():
        raise CheckInputError(f"{source}: not a folder")
    run_dir = results / run_id
    # Any run folder with content is a run's (finished, interrupted or still running): an
    # import never writes over a measured record, so it goes under a new id.
    held = next(
        (str(p.relative_to(run_dir)) for p in sorted(run_dir.rglob("*")) if p.is_file()), None
    )
    if held is not None:
        raise CheckInputError(
            f"{run_dir}: already holds a run ({held}, ...); import under another --run-id"
        )
    report = ImportReport(run_dir=run_dir)
    cells: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for path in sorted(source.glob(mapping.files)):
        rel = str(path.relative_to(source))
        lines = _records(path)
        for n, line in lines:
            where = f"{rel}:{n}" if len(lines) > 1 else rel
            try:
                data = loads_json(line)
                record = BenchRecord.model_validate(data)
                server = _axes(mapping.server, rel=rel, data=data)
                client = _axes(mapping.client, rel=rel, data=data)
                repeat = None
                if mapping.repeat is not None:
                    match = re.search(mapping.repeat, rel)
                    if match is None:
                        raise ValueError(f"repeat: {mapping.repeat!r} does not match the path")
                    repeat = int(match.group(1))
                # An id read from a record or a path is one folder name (UnsafeName otherwise).
                key = (
                    safe_segment(segment(server, "default"), what="server id"),
                    safe_segment(segment(client, "default"), what="client id"),
                )
            except (ValueError, ValidationError) as exc:
                report.rejected.append(f"{where}: unreadable: {str(exc).splitlines()[0]}")
                continue
            verdict = judge_record(record, min_retokenized_ratio=min_retokenized_ratio)
            if verdict.problems:
                report.rejected.append(f"{where}: {verdict.line()}")
                continue
            if verdict.warnings:
                report.warnings.append(f"{where}: {verdict.line()}")
            entry = {
                "where": where,
                "file": rel,
                "line": line,
                "data": data,
                "record": record,
                "repeat": repeat,
            }
            cells.setdefault(key, []).append({**entry, "server": server, "client": client})
    report.warnings += merged_files(cells, mapping=mapping)
    rows, request_keys, request_figures = [], [], []
    for (server_id, client_id), entries in cells.items():
        taken: set[int] = set()
        for index, entry in enumerate(entries, start=1):
            repeat = entry["repeat"] if entry["repeat"] is not None else index
            if repeat in taken:
                report.rejected.append(
                    f"{entry['where']}: cell {server_id}/{client_id} repeat {repeat} twice"
                )
                continue
            taken.add(repeat)
            raw = cell_file(run_dir, "raw", server_id=server_id, client_id=client_id, repeat=repeat)
            # strict JSON (bench_serving's bare Infinity becomes null + non_finite)
            write_text_atomic(raw, strict_json(entry["data"]) + "\n")
            metrics = record_metrics(entry["data"])
            rows.append(
                {
                    "run_id": run_id,
                    "server_id": server_id,
                    "client_id": client_id,
                    "repeat": repeat,
                    "fingerprint": IMPORTED_FINGERPRINT,
                    **entry["server"],
                    **entry["client"],
                    **metrics,
                    **engine_figures(metrics, engine_kind="sglang", time_scale=None),
                    **gpu_figures([]),
                    "gpu_status": "missing",
                    **_tails(entry["record"]),
                }
            )
            request_keys.append((server_id, client_id, repeat))
            request_figures.append(stats.request_figures(entry["record"]))
            report.imported.append(entry["where"])
    if not rows:
        first = f"; first: {report.rejected[0]}" if report.rejected else ""
        raise CheckInputError(
            f"{source}: no valid record matched {mapping.files!r} "
            f"({len(report.rejected)} rejected{first})"
        )
    server_axes, client_axes = list(mapping.server), list(mapping.client)
    df = pd.DataFrame(rows, columns=result_columns(server_axes, client_axes))
    for col in (*INTEGER_METRICS, "gpu_count"):
        df[col] = pd.to_numeric(df[col]).astype("Int64")
    df = significant(df)
    write_results_csv(df, run_dir / "results.csv")
    requests = request_table(request_keys, request_figures)
    write_requests_csv(requests, run_dir / "requests.csv")
    summary = summarize(
        results=df,
        baseline=mapping.baseline,
        server_axes=server_axes,
        client_axes=client_axes,
        requests=load_requests(results=df, requests=requests),
    )
    summary["imported"] = {
        "source": str(source),
        "records": len(report.imported),
        "rejected": report.rejected,
        "warnings": len(report.warnings),
    }
    write_summary(summary, run_dir / "summary.json")
    write_json_atomic(run_dir / "import.json", {"mapping": mapping.model_dump(mode="json")})
    if plots:
        _plots(run_dir=run_dir, summary=summary, results=df, mapping=mapping)
    log.info("imported %d record(s) into %s", len(report.imported), run_dir)
    return report


def _plots(
    *, run_dir: Path, summary: dict[str, Any], results: pd.DataFrame, mapping: Mapping
) -> None:
    from servesweep.analysis import plots

    x = next(iter(mapping.client), None)
    hue, col = plots.series_axes(list(mapping.server), mapping.baseline)
    folder = run_dir / "plots"
    plots.write_run_plots(
        summary=summary,
        results=results,
        # no deltas (no baseline twin): no delta plots; summary.json's note says why
        deltas={m: folder / f"delta_{m}.png" for m in PLOT_METRICS} if summary["deltas"] else {},
        metric_vs={m: folder / f"{m}_vs_{x}.png" for m in PLOT_METRICS} if x else {},
        x=x,
        hue=hue,
        col=col,
    )


def _tails(record: BenchRecord) -> dict[str, float]:
    """The tail percentiles of an imported record's details (no GPU or SLO figures)."""
    tails = figures.tail_figures(stats.request_details(record))
    return {c: tails[c] for c in TAIL_COLUMNS}
