"""Records to results.csv (one row per cell-repeat) and summary.json (medians, deltas)."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import ValidationError

from servesweep import telemetry
from servesweep.config import CellRepeat, RunPaths
from servesweep.errors import CellFailed
from servesweep.files import atomic_open, write_text_atomic
from servesweep.records import BenchRecord, read_record

log = logging.getLogger(__name__)

# results.csv metric column -> bench_serving record key (SGLANG.md 1.5-1.6).
METRICS: dict[str, str] = {
    "ttft_p50_ms": "median_ttft_ms",
    "ttft_p95_ms": "p95_ttft_ms",  # 0.5.14+; NaN for 0.5.9-0.5.13 records
    "ttft_p99_ms": "p99_ttft_ms",
    "ttft_mean_ms": "mean_ttft_ms",
    "e2e_p50_ms": "median_e2e_latency_ms",
    "e2e_p99_ms": "p99_e2e_latency_ms",
    "e2e_mean_ms": "mean_e2e_latency_ms",
    "tpot_p50_ms": "median_tpot_ms",
    "tpot_p95_ms": "p95_tpot_ms",  # 0.5.14+
    "itl_p50_ms": "median_itl_ms",
    "input_tps": "input_throughput",
    "output_tps": "output_throughput",
    "request_tps": "request_throughput",
    "duration_s": "duration",
    "completed": "completed",
    "total_input_tokens": "total_input_tokens",
    "total_output_tokens": "total_output_tokens",
    "concurrency_mean": "concurrency",
}
INTEGER_METRICS = ("completed", "total_input_tokens", "total_output_tokens")
# Keys every supported record version (0.5.9..0.5.23, builtin) has; absent = invalid record.
REQUIRED_KEYS = (
    "completed",
    "duration",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_e2e_latency_ms",
    "input_throughput",
    "total_input_tokens",
    "total_output_tokens",
)
ID_COLUMNS = ("run_id", "server_id", "client_id", "repeat", "fingerprint")
# Metrics summarized per cell and compared with the baseline, and which direction is better.
SUMMARY_METRICS: dict[str, str] = {
    "ttft_p50_ms": "lower",
    "ttft_p95_ms": "lower",
    "ttft_p99_ms": "lower",
    "e2e_p50_ms": "lower",
    "input_tps": "higher",
    "tpot_p50_ms": "lower",  # only for cells whose requests produced more than one token
}
OUTPUT_DEPENDENT = ("tpot_p50_ms",)


# ---------------------------------------------------------------- records -> rows


def _number(key: str, value: Any) -> float:
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"record key {key}: not a number: {value!r}")
    return float(value)


def record_metrics(record: BenchRecord | Mapping[str, Any]) -> dict[str, float | int]:
    """The METRICS of one record; absent keys are NaN (older bench_serving versions)."""
    data = record.model_dump() if isinstance(record, BenchRecord) else dict(record)
    out: dict[str, float | int] = {}
    for column, key in METRICS.items():
        value = _number(key, data.get(key))
        out[column] = int(value) if column in INTEGER_METRICS and value.is_integer() else value
    return out


def check_record(record: BenchRecord | Mapping[str, Any]) -> list[str]:
    """Why a record cannot be analysed (missing required keys, nothing completed); [] if fine."""
    data = record.model_dump() if isinstance(record, BenchRecord) else dict(record)
    problems = [f"missing {key}" for key in REQUIRED_KEYS if data.get(key) is None]
    completed = data.get("completed")
    if isinstance(completed, int | float) and completed < 1:
        problems.append(f"completed = {completed}")
    return problems


def cell_metrics(path: Path, *, cell: CellRepeat) -> dict[str, float | int]:
    """Read and check one raw cell-repeat file; CellFailed names the cell and the file."""
    try:
        record = read_record(path)
        metrics = record_metrics(record)
    except FileNotFoundError:
        raise CellFailed(f"cell {cell.key}: raw record {path} is missing") from None
    except (ValueError, ValidationError) as exc:  # JSON, line count, field types
        first = str(exc).strip().splitlines()[0]
        raise CellFailed(f"cell {cell.key}: raw record {path} is invalid: {first}") from None
    problems = check_record(record)
    if problems:
        raise CellFailed(f"cell {cell.key}: raw record {path} is invalid: {'; '.join(problems)}")
    return metrics


def cell_gpu(path: Path, *, cell: CellRepeat) -> dict[str, Any]:
    """GPU figures of one cell-repeat; a missing snapshot file gives NaN and status `missing`."""
    if not path.exists():
        log.warning("cell %s: no GPU snapshot %s", cell.key, path)
        figures = telemetry.gpu_figures(telemetry.snapshot_frame([]))
        return {**figures, "gpu_status": "missing"}
    return telemetry.gpu_figures(telemetry.read_snapshot(path))


def _axis_names(axes: Iterable[Mapping[str, Any]]) -> list[str]:
    names: dict[str, None] = {}
    for a in axes:
        names.update(dict.fromkeys(a))
    return list(names)


def result_columns(server_axes: Sequence[str], client_axes: Sequence[str]) -> list[str]:
    """Column order of results.csv: ids, server axes, client axes, metrics, GPU figures."""
    return [*ID_COLUMNS, *server_axes, *client_axes, *METRICS, *telemetry.GPU_FIGURES]


def result_row(
    *,
    run_id: str,
    cell: CellRepeat,
    metrics: Mapping[str, Any],
    gpu: Mapping[str, Any],
) -> dict[str, Any]:
    """One results.csv row (pure)."""
    return {
        "run_id": run_id,
        "server_id": cell.server.id,
        "client_id": cell.client.id,
        "repeat": cell.repeat,
        "fingerprint": cell.server.fingerprint,
        **cell.server.axes,
        **cell.client.axes,
        **metrics,
        **gpu,
    }


def collect_results(*, cells: Sequence[CellRepeat], paths: RunPaths) -> pd.DataFrame:
    """One row per cell-repeat from the raw records and GPU snapshots of a run."""
    server_axes = _axis_names(c.server.axes for c in cells)
    client_axes = _axis_names(c.client.axes for c in cells)
    rows = [
        result_row(
            run_id=paths.root.name,
            cell=cell,
            metrics=cell_metrics(paths.raw(cell), cell=cell),
            gpu=cell_gpu(paths.gpu(cell), cell=cell),
        )
        for cell in cells
    ]
    df = pd.DataFrame(rows, columns=result_columns(server_axes, client_axes))
    for col in (*INTEGER_METRICS, "gpu_count"):
        df[col] = pd.to_numeric(df[col]).astype("Int64")
    log.info("collected %d cell-repeats of run %s", len(df), paths.root.name)
    return df


def write_results_csv(df: pd.DataFrame, path: str | Path) -> None:
    """Write results.csv atomically."""
    with atomic_open(path) as fh:
        df.to_csv(fh, index=False)


def read_results_csv(path: str | Path) -> pd.DataFrame:
    """Read results.csv back (integer columns stay integers where they have no gaps)."""
    return pd.read_csv(path)


# ---------------------------------------------------------------- summary


def _py(value: Any) -> Any:
    """A JSON-ready Python scalar: numpy types unwrapped, NaN/NA -> None."""
    if value is None or value is pd.NA:
        return None
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _key(value: Any) -> str:
    """Comparable form of an axis value: 8192, 8192.0 and "8192" are the same cell."""
    value = _py(value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def group_cells(
    results: pd.DataFrame, axes: Sequence[str]
) -> list[tuple[dict[str, Any], pd.DataFrame]]:
    """(axes values, repeat rows) per cell, in first-appearance (matrix) order."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for pos, row in enumerate(results[list(axes)].itertuples(index=False, name=None)):
        groups.setdefault(tuple(_key(v) for v in row), []).append(pos)
    out = []
    for positions in groups.values():
        rows = results.iloc[positions]
        first = rows.iloc[0]
        out.append(({a: _py(first[a]) for a in axes}, rows))
    return out


def cell_metric_names(rows: pd.DataFrame) -> list[str]:
    """SUMMARY_METRICS that apply to a cell: TPOT only if requests produced > 1 token."""
    per_request = rows["total_output_tokens"] / rows["completed"]
    multi_token = bool(len(rows)) and bool((per_request > 1).all())
    return [m for m in SUMMARY_METRICS if multi_token or m not in OUTPUT_DEPENDENT]


def metric_stats(values: pd.Series) -> dict[str, Any]:
    """Spread of one metric over a cell's repeats (extension point: intervals)."""
    v = pd.to_numeric(values, errors="coerce").dropna()
    if v.empty:
        return {"median": None, "min": None, "max": None}
    return {"median": _py(v.median()), "min": _py(v.min()), "max": _py(v.max())}


def compare(candidate: pd.Series, baseline: pd.Series, *, better: str) -> dict[str, Any]:
    """Candidate vs baseline medians of one metric (extension point: bootstrap, verdict)."""
    cand = metric_stats(candidate)["median"]
    base = metric_stats(baseline)["median"]
    out: dict[str, Any] = {
        "candidate_median": cand,
        "baseline_median": base,
        "delta_abs": None,
        "delta_pct": None,
        "better": None,
    }
    if cand is None or base is None:
        return out
    out["delta_abs"] = cand - base
    out["delta_pct"] = 100.0 * (cand - base) / base if base != 0 else None
    out["better"] = cand < base if better == "lower" else cand > base
    return out


def cell_label(axes: Mapping[str, Any]) -> str:
    """`moe_runner_backend=flashinfer_mxfp4, chunked_prefill_size=8192, concurrency=8`."""
    return ", ".join(f"{k}={_key(v)}" for k, v in axes.items()) or "default"


def summarize_cells(
    groups: Sequence[tuple[dict[str, Any], pd.DataFrame]],
) -> list[dict[str, Any]]:
    """Per cell: ids, number of repeats and median/min/max of each summary metric."""
    cells = []
    for axes, rows in groups:
        cells.append(
            {
                "axes": axes,
                "label": cell_label(axes),
                "server_id": _py(rows["server_id"].iloc[0]) if "server_id" in rows else None,
                "client_id": _py(rows["client_id"].iloc[0]) if "client_id" in rows else None,
                "n": len(rows),
                "metrics": {m: metric_stats(rows[m]) for m in cell_metric_names(rows)},
            }
        )
    return cells


def baseline_deltas(
    groups: Sequence[tuple[dict[str, Any], pd.DataFrame]],
    *,
    baseline: Mapping[str, Any],
) -> tuple[list[dict[str, Any]], str | None]:
    """Deltas of every non-baseline cell vs its baseline twin, and a note when there are none."""
    if not baseline:
        return [], "no baseline in this run (none configured, or narrowed out of the matrix)"
    if not groups:
        return [], "no results in this run"
    (axis, value), *_ = baseline.items()
    axes_known = list(groups[0][0])
    if axis not in axes_known:
        return [], f"baseline axis {axis} is not an axis of this run"
    want = _key(value)
    others = [a for a in axes_known if a != axis]
    twins = {
        tuple(_key(ax[a]) for a in others): rows for ax, rows in groups if _key(ax[axis]) == want
    }
    if not twins:
        return [], f"baseline {axis}={_key(value)} has no results in this run"
    deltas = []
    for ax, rows in groups:
        if _key(ax[axis]) == want:
            continue
        base_rows = twins.get(tuple(_key(ax[a]) for a in others))
        if base_rows is None:
            log.warning("cell %s has no baseline twin with %s=%s", cell_label(ax), axis, want)
            continue
        base_axes = {**ax, axis: _py(value)}
        metrics = [m for m in cell_metric_names(rows) if m in cell_metric_names(base_rows)]
        deltas.append(
            {
                "axes": ax,
                "label": cell_label(ax),
                "baseline_axes": base_axes,
                "n_candidate": len(rows),
                "n_baseline": len(base_rows),
                "metrics": {
                    m: compare(rows[m], base_rows[m], better=SUMMARY_METRICS[m]) for m in metrics
                },
            }
        )
    if not deltas:
        return [], f"only the baseline {axis}={want} ran: no other value to compare"
    return deltas, None


def summarize(
    *,
    results: pd.DataFrame,
    baseline: Mapping[str, Any],
    server_axes: Sequence[str],
    client_axes: Sequence[str],
) -> dict[str, Any]:
    """JSON-ready summary: per-cell medians over repeats and deltas vs the baseline value."""
    axes = [*server_axes, *client_axes]
    missing = [a for a in axes if a not in results.columns]
    if missing and len(results):
        raise ValueError(f"results have no column(s) for axes {missing}")
    groups = group_cells(results, axes) if len(results) else []
    deltas, note = baseline_deltas(groups, baseline=dict(baseline))
    run_ids = sorted({str(r) for r in results["run_id"]}) if "run_id" in results else []
    return {
        "run_id": run_ids[0] if len(run_ids) == 1 else None,
        "baseline": {k: _py(v) for k, v in baseline.items()},
        "server_axes": list(server_axes),
        "client_axes": list(client_axes),
        "metrics": {m: {"better": d} for m, d in SUMMARY_METRICS.items()},
        "cells": summarize_cells(groups),
        "deltas": deltas,
        "note": note,
    }


def write_summary(summary: Mapping[str, Any], path: str | Path) -> None:
    """Write summary.json atomically; strict JSON (no NaN/Infinity)."""
    write_text_atomic(path, json.dumps(_jsonable(summary), indent=2, allow_nan=False) + "\n")


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return _py(value)


def read_summary(path: str | Path) -> dict[str, Any]:
    """Read summary.json."""
    return json.loads(Path(path).read_text())
