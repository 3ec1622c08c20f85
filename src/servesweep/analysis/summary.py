"""summary.json: per-cell medians and bootstrap intervals, deltas vs the baseline, verdicts."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from servesweep.analysis import labels, stats, symptoms
from servesweep.analysis.planned import (  # noqa: F401 (re-exported: the summary's names)
    SUMMARY_METRICS,
    _key,
    _twins,
    cell_label,
    expected_delta_note,
    plot_metrics,
)
from servesweep.core.files import write_text_atomic
from servesweep.core.jsontext import indented_json
from servesweep.core.parallel import map_chunks
from servesweep.measure.records import read_record

log = logging.getLogger(__name__)

# Listed for every cell even without a value; the others (energy without GPU samples, goodput
# without an SLO, tails without per-request details) only where a repeat has one.
ALWAYS_LISTED = frozenset(
    {"ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "e2e_p50_ms", "input_tps", "tpot_p50_ms"}
)
# Metrics that need outputs of more than one token (TPOT, ITL; output rates, which are the
# request rate for 1-token outputs, and 0 for a cell's 1-s peak when no bucket has a second token).
OUTPUT_DEPENDENT = (
    "tpot_p50_ms",
    "tpot_p99_ms",
    "itl_p99_ms",
    "interactivity_tps",
    "output_tps_peak",
    "output_tps_per_gpu",
    "joules_per_output_token",
    "output_tokens_per_watt",
)


# ---------------------------------------------------------------- cells, medians, deltas


def _py(value: Any) -> Any:
    """A JSON-ready Python scalar: numpy types unwrapped, NaN/NA -> None."""
    if value is None or value is pd.NA:
        return None
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def json_value(value: Any) -> Any:
    """A JSON-ready Python scalar (numpy unwrapped, NaN/NA -> None)."""
    return _py(value)


def _cell_positions(
    results: pd.DataFrame, axes: Sequence[str]
) -> list[tuple[dict[str, Any], list[int]]]:
    """(axes values, row positions) per cell, in first-appearance (matrix) order."""
    groups: dict[tuple[str, ...], tuple[dict[str, Any], list[int]]] = {}
    for pos, row in enumerate(results[list(axes)].itertuples(index=False, name=None)):
        key = tuple(_key(v) for v in row)
        if key not in groups:
            groups[key] = ({a: _py(v) for a, v in zip(axes, row, strict=True)}, [])
        groups[key][1].append(pos)
    return list(groups.values())


def group_cells(
    results: pd.DataFrame, axes: Sequence[str]
) -> list[tuple[dict[str, Any], pd.DataFrame]]:
    """(axes values, repeat rows) per cell, in first-appearance (matrix) order."""
    return [(ax, results.iloc[pos]) for ax, pos in _cell_positions(results, axes)]


def _multi_token(rows: pd.DataFrame) -> np.ndarray:
    """Per row: did its requests produce more than one token on average? (A missing figure
    counts as yes: pandas' all() skips it.)"""
    per_request = rows["total_output_tokens"] / rows["completed"]
    return (per_request > 1).to_numpy(dtype=bool, na_value=True)


def _metric_names(multi_token: np.ndarray) -> list[str]:
    """SUMMARY_METRICS of a cell from its rows' `_multi_token` flags."""
    multi = bool(multi_token.size) and bool(multi_token.all())
    return [m for m in SUMMARY_METRICS if multi or m not in OUTPUT_DEPENDENT]


def cell_metric_names(rows: pd.DataFrame) -> list[str]:
    """SUMMARY_METRICS that apply to a cell: TPOT only if requests produced > 1 token; the
    metrics beyond ALWAYS_LISTED only where a repeat has a value."""
    return [
        m
        for m in _metric_names(_multi_token(rows))
        if m in rows.columns and _listed(m, _floats(rows[m]))
    ]


def _listed(metric: str, values: np.ndarray) -> bool:
    """Whether a cell lists `metric` given its repeats' values (see ALWAYS_LISTED)."""
    return metric in ALWAYS_LISTED or bool(np.isfinite(values).any())


def _floats(values: pd.Series | np.ndarray | Sequence[float]) -> np.ndarray:
    if isinstance(values, np.ndarray) and values.dtype == float:
        return values
    if isinstance(values, pd.Series) and pd.api.types.is_numeric_dtype(values.dtype):
        return values.to_numpy(dtype=float, na_value=np.nan)
    return pd.to_numeric(pd.Series(values), errors="coerce").to_numpy(float)


def _median(values: pd.Series | np.ndarray | Sequence[float]) -> float | None:
    v = np.sort(_floats(values))
    v = v[np.isfinite(v)]
    return stats.figure_stat(v, 50.0) if v.size else None


def metric_stats(
    values: pd.Series | np.ndarray | Sequence[float],
    *,
    replicates: stats.Replicates | None = None,
    level: float = stats.LEVEL,
    bootstrapped: bool = False,
) -> dict[str, Any]:
    """Spread of one metric over a cell's repeats; with `bootstrapped`, its interval too.

    `ci_low`/`ci_high` bound the bootstrap interval of the median (None without replicates,
    or for one repeat without per-request data: nothing measures its noise), `resampled`
    says what was resampled (`repeats+requests`, `repeats`, None).
    """
    v = np.sort(_floats(values))
    v = v[np.isfinite(v)]
    out: dict[str, Any] = {"median": None, "min": None, "max": None}
    if v.size:
        out = {"median": stats.figure_stat(v, 50.0), "min": float(v[0]), "max": float(v[-1])}
    if not bootstrapped and replicates is None:
        return out
    bounds = None
    if replicates is not None and replicates.spread_known:  # else no honest interval
        bounds = stats.interval(replicates.values, level=level)
    out["ci_low"], out["ci_high"] = bounds if bounds else (None, None)
    out["resampled"] = replicates.resampled if replicates is not None else None
    return out


def compare(
    candidate: pd.Series | np.ndarray | Sequence[float],
    baseline: pd.Series | np.ndarray | Sequence[float],
    *,
    better: str,
    candidate_replicates: stats.Replicates | None = None,
    baseline_replicates: stats.Replicates | None = None,
    level: float = stats.LEVEL,
) -> dict[str, Any]:
    """Candidate vs baseline medians of one metric, the % delta's interval and the verdict.

    `better` (bool) is the direction of the point change alone; `verdict` is the honest one:
    `better`/`worse` only when the interval of the % delta excludes 0 (stats.verdict).
    """
    cand = _median(candidate)
    base = _median(baseline)
    out: dict[str, Any] = {
        "candidate_median": cand,
        "baseline_median": base,
        "delta_abs": None,
        "delta_pct": None,
        "better": None,
        "ci_low": None,
        "ci_high": None,
        "verdict": stats.UNKNOWN,
        "p_value": None,
    }
    if cand is None or base is None:
        return out
    out["delta_abs"] = cand - base
    out["delta_pct"] = 100.0 * (cand - base) / base if base != 0 else None
    out["better"] = cand < base if better == "lower" else cand > base
    if out["delta_pct"] is None:
        return out
    delta = stats.compare_replicates(
        candidate_replicates, baseline_replicates, better=better, level=level
    )
    out["ci_low"], out["ci_high"], out["verdict"] = delta.low, delta.high, delta.verdict
    out["p_value"] = delta.p_value
    return out


# ---------------------------------------------------------------- bootstrap inputs

# (server_id, client_id, repeat) -> per-request figures of that cell-repeat (None: none).
RequestData = Mapping[tuple[str, str, int], "stats.Requests | None"]


def load_requests(
    *, results: pd.DataFrame, requests: pd.DataFrame | None
) -> dict[tuple[str, str, int], stats.Requests | None]:
    """Per-request figures of every cell-repeat in results.csv, from requests.csv (`requests`,
    results.read_requests_csv; None: the run has none).

    Keyed by (server_id, client_id, repeat); a cell-repeat without rows in requests.csv gives
    None, and its cell is resampled at the repeat level only.
    """
    groups: dict[tuple[str, str, int], np.ndarray] = {}
    if requests is not None and len(requests):
        index = requests.groupby(["server_id", "client_id", "repeat"], sort=False).indices
        groups = {(str(s), str(c), int(r)): pos for (s, c, r), pos in index.items()}
    columns = (
        [requests[c].to_numpy(dtype=float) for c in ("ttft_ms", "e2e_ms", "tpot_ms")]
        if groups and requests is not None
        else []
    )
    out: dict[tuple[str, str, int], stats.Requests | None] = {}
    keys = results[["server_id", "client_id", "repeat"]].itertuples(index=False, name=None)
    for server_id, client_id, repeat in keys:
        key = (str(server_id), str(client_id), int(repeat))
        pos = groups.get(key)
        out[key] = None if pos is None else stats.sorted_requests(*(c[pos] for c in columns))
    missing = sum(v is None for v in out.values())
    if missing:
        log.warning("%d of %d cell-repeats have no per-request details", missing, len(out))
    log.info("loaded per-request details of %d cell-repeats", len(out) - missing)
    return out


# Columns that identify a cell's rows: the key of its random streams and of its requests.
CELL_ID_COLUMNS = ("run_id", "server_id", "client_id", "repeat")


def _ids(rows: pd.DataFrame) -> dict[str, list[Any]]:
    """CELL_ID_COLUMNS present in `rows` -> their values."""
    return {c: rows[c].tolist() for c in CELL_ID_COLUMNS if c in rows.columns}


def _cell_key(ids: Mapping[str, Sequence[Any]], axes: Mapping[str, Any]) -> str:
    """The random-stream key of a cell: `run|server|client` of its first row, else its label."""
    cols = ("run_id", "server_id", "client_id")
    if all(c in ids and len(ids[c]) for c in cols):
        return "|".join(str(ids[c][0]) for c in cols)
    return cell_label(axes)


def _row_requests(
    ids: Mapping[str, Sequence[Any]], requests: RequestData | None
) -> list[stats.Requests | None] | None:
    """Per-request figures of each row (None: the row has none), None without request data."""
    if requests is None or not {"server_id", "client_id", "repeat"} <= set(ids):
        return None
    rows = zip(ids["server_id"], ids["client_id"], ids["repeat"], strict=True)
    return [requests.get((str(s), str(c), int(r))) for s, c, r in rows]


def cell_replicates(
    rows: pd.DataFrame,
    *,
    metrics: Sequence[str],
    requests: RequestData | None = None,
    bootstrap: stats.Bootstrap = stats.DEFAULT,
    key: str | None = None,
) -> dict[str, stats.Replicates | None]:
    """Bootstrap replicates of each metric's median over a cell's repeat rows."""
    ids = _ids(rows)
    return stats.cell_replicates(
        values={m: _floats(rows[m]) for m in metrics},
        requests=_row_requests(ids, requests),
        key=key or _cell_key(ids, {}),
        bootstrap=bootstrap,
    )


# ---------------------------------------------------------------- summary.json


@dataclass(frozen=True)
class _Cell:
    """One cell's rows as plain values (pandas calls per cell dominate large summaries)."""

    axes: dict[str, Any]
    n: int  # repeat rows
    ids: dict[str, list[Any]]  # CELL_ID_COLUMNS present -> the rows' values
    metrics: list[str]
    values: dict[str, np.ndarray]  # metric -> the rows' values as floats


def _cells(
    results: pd.DataFrame, positions: Sequence[tuple[dict[str, Any], Sequence[int]]]
) -> list[_Cell]:
    """The cells given by (axes, row positions in `results`); each column is converted once."""
    if not positions:
        return []
    ids = _ids(results)
    multi = _multi_token(results)
    columns = {m: _floats(results[m]) for m in SUMMARY_METRICS if m in results.columns}
    cells = []
    for axes, pos in positions:
        rows = np.asarray(pos, dtype=np.intp)
        metrics = [
            m
            for m in _metric_names(multi[rows])
            if m in columns and _listed(m, columns[m][rows])  # an older results.csv lacks some
        ]
        cells.append(
            _Cell(
                axes=axes,
                n=len(rows),
                ids={c: [v[i] for i in pos] for c, v in ids.items()},
                metrics=metrics,
                values={m: columns[m][rows] for m in metrics},
            )
        )
    return cells


def _cells_of_groups(groups: Sequence[tuple[dict[str, Any], pd.DataFrame]]) -> list[_Cell]:
    """The cells of (axes, repeat rows) groups, as group_cells gives them."""
    if not groups:
        return []
    ends = np.cumsum([len(rows) for _, rows in groups]).tolist()
    starts = [0, *ends[:-1]]
    frame = pd.concat([rows for _, rows in groups], ignore_index=True)
    positions = [(ax, range(a, b)) for (ax, _), a, b in zip(groups, starts, ends, strict=True)]
    return _cells(frame, positions)


def _cell_entry(
    cell: _Cell,
    reps: Mapping[str, stats.Replicates | None] | None,
    bootstrap: stats.Bootstrap | None,
) -> dict[str, Any]:
    ids = cell.ids
    entry: dict[str, Any] = {
        "axes": cell.axes,
        "label": cell_label(cell.axes),
        "server_id": _py(ids["server_id"][0]) if "server_id" in ids else None,
        "client_id": _py(ids["client_id"][0]) if "client_id" in ids else None,
        "n": cell.n,
    }
    if bootstrap is not None:
        entry["repeat_resamples"] = stats.distinct_resamples(cell.n)
        entry["coarse"] = stats.is_coarse(cell.n)
    entry["metrics"] = {
        m: metric_stats(
            cell.values[m],
            replicates=(reps or {}).get(m),
            level=bootstrap.level if bootstrap else stats.LEVEL,
            bootstrapped=bootstrap is not None,
        )
        for m in cell.metrics
    }
    return entry


def _delta_entry(
    cand: _Cell,
    base: _Cell,
    *,
    axis: str,
    value: Any,
    reps: Mapping[str, stats.Replicates | None] | None,
    base_reps: Mapping[str, stats.Replicates | None] | None,
    bootstrap: stats.Bootstrap | None,
) -> dict[str, Any]:
    n_cand, n_base = cand.n, base.n
    entry: dict[str, Any] = {
        "axes": cand.axes,
        "label": cell_label(cand.axes),
        "baseline_axes": {**cand.axes, axis: _py(value)},
        "n_candidate": n_cand,
        "n_baseline": n_base,
    }
    if bootstrap is not None:
        entry["coarse"] = stats.is_coarse(n_cand) or stats.is_coarse(n_base)
    entry["metrics"] = {
        m: compare(
            cand.values[m],
            base.values[m],
            better=SUMMARY_METRICS[m],
            candidate_replicates=(reps or {}).get(m),
            baseline_replicates=(base_reps or {}).get(m),
            level=bootstrap.level if bootstrap else stats.LEVEL,
        )
        for m in cand.metrics
        if m in base.values
    }
    return entry


def _analyse(
    cells: Sequence[_Cell],
    *,
    baseline: Mapping[str, Any],
    requests: RequestData | None,
    bootstrap: stats.Bootstrap | None,
    workers: int = 1,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str | None]:
    """Cells and deltas, in cell order. A baseline cell and its candidates are one group (its
    replicates are drawn once, kept only while the group is analysed); the groups are
    analysed in `workers` processes (core.parallel). Every cell's replicates are seeded by
    its own key, so the figures do not depend on the grouping or the workers."""
    twins, note = _twins([cell.axes for cell in cells], baseline)
    groups: dict[int, list[int]] = {}
    for i in range(len(cells)):
        groups.setdefault(twins.get(i, i), []).append(i)
    axis, value = next(iter(baseline.items())) if baseline else (None, None)
    analyse = partial(
        _analyse_groups,
        cells=cells,
        twins=twins,
        axis=str(axis),
        value=value,
        requests=requests,
        bootstrap=bootstrap,
    )
    entries: list[dict[str, Any]] = [{} for _ in cells]
    deltas: dict[int, dict[str, Any]] = {}
    groups_done = map_chunks(
        analyse, list(groups.values()), workers=workers, what="computing the summary's statistics"
    )
    for group in groups_done:
        for i, entry, delta in group:
            entries[i] = entry
            if delta is not None:
                deltas[i] = delta
    return entries, [deltas[i] for i in sorted(deltas)], note


def _analyse_groups(
    groups: Sequence[Sequence[int]],
    *,
    cells: Sequence[_Cell],
    twins: Mapping[int, int],
    axis: str,
    value: Any,
    requests: RequestData | None,
    bootstrap: stats.Bootstrap | None,
) -> list[list[tuple[int, dict[str, Any], dict[str, Any] | None]]]:
    """Per group of cell indices: (index, cell entry, delta entry or None) of each member."""

    def replicates(i: int) -> dict[str, stats.Replicates | None] | None:
        if bootstrap is None:
            return None
        cell = cells[i]
        return stats.cell_replicates(
            values=cell.values,
            requests=_row_requests(cell.ids, requests),
            key=_cell_key(cell.ids, cell.axes),
            bootstrap=bootstrap,
        )

    out = []
    for members in groups:
        base = twins.get(members[0], members[0])  # the group's baseline cell (or its only one)
        base_reps = replicates(base)
        analysed = []
        for i in members:
            reps = base_reps if i == base else replicates(i)
            delta = None
            if i in twins:
                delta = _delta_entry(
                    cells[i],
                    cells[base],
                    axis=axis,
                    value=value,
                    reps=reps,
                    base_reps=base_reps,
                    bootstrap=bootstrap,
                )
            analysed.append((i, _cell_entry(cells[i], reps, bootstrap), delta))
        out.append(analysed)
    return out


def summarize_cells(
    groups: Sequence[tuple[dict[str, Any], pd.DataFrame]],
    *,
    requests: RequestData | None = None,
    bootstrap: stats.Bootstrap | None = stats.DEFAULT,
) -> list[dict[str, Any]]:
    """Per cell: ids, number of repeats, median/min/max and interval of each summary metric."""
    cells = _cells_of_groups(groups)
    return _analyse(cells, baseline={}, requests=requests, bootstrap=bootstrap)[0]


def baseline_deltas(
    groups: Sequence[tuple[dict[str, Any], pd.DataFrame]],
    *,
    baseline: Mapping[str, Any],
    requests: RequestData | None = None,
    bootstrap: stats.Bootstrap | None = stats.DEFAULT,
) -> tuple[list[dict[str, Any]], str | None]:
    """Deltas of every non-baseline cell vs its baseline twin (verdicts under control_fdr over
    all of them, as in summarize), and a note when there are none."""
    _, deltas, note = _analyse(
        _cells_of_groups(groups), baseline=dict(baseline), requests=requests, bootstrap=bootstrap
    )
    _control_fdr(deltas, bootstrap)
    return deltas, note


def _control_fdr(deltas: Sequence[Mapping[str, Any]], bootstrap: stats.Bootstrap | None) -> None:
    """Every delta's verdicts under one false-discovery rate (stats.control_fdr)."""
    if bootstrap is not None:
        stats.control_fdr([m for d in deltas for m in d["metrics"].values()], level=bootstrap.level)


def _resampled(cells: Sequence[Mapping[str, Any]]) -> dict[str, str | None]:
    """metric -> how it was resampled over all cells (`mixed` if cells differ)."""
    seen: dict[str, set[str | None]] = {}
    for cell in cells:
        for m, s in cell["metrics"].items():
            seen.setdefault(m, set()).add(s.get("resampled"))
    return {m: next(iter(v)) if len(v) == 1 else "mixed" for m, v in seen.items()}


def summarize(
    *,
    results: pd.DataFrame,
    baseline: Mapping[str, Any],
    server_axes: Sequence[str],
    client_axes: Sequence[str],
    requests: RequestData | None = None,
    bootstrap: stats.Bootstrap | None = stats.DEFAULT,
    workers: int = 1,
) -> dict[str, Any]:
    """JSON-ready summary: per-cell medians and intervals, deltas vs the baseline, verdicts.

    `requests` (from load_requests) enables request-level resampling; `bootstrap=None`
    gives medians and point deltas only (no intervals, verdicts `unknown`); `workers`:
    processes that resample (the same figures for any number).
    """
    axes = [*server_axes, *client_axes]
    missing = [a for a in axes if a not in results.columns]
    if missing and len(results):
        raise ValueError(f"results have no column(s) for axes {missing}")
    cells = _cells(results, _cell_positions(results, axes)) if len(results) else []
    entries, deltas, note = _analyse(
        cells, baseline=dict(baseline), requests=requests, bootstrap=bootstrap, workers=workers
    )
    _control_fdr(deltas, bootstrap)
    run_ids = sorted({str(r) for r in results["run_id"]}) if "run_id" in results else []
    summary: dict[str, Any] = {
        "run_id": run_ids[0] if len(run_ids) == 1 else None,
        # {kind, time_scale} of the engine (results.csv's engine_kind, sim_time_scale)
        "engine": labels.engine_of(results),
        "baseline": {k: _py(v) for k, v in baseline.items()},
        "server_axes": list(server_axes),
        "client_axes": list(client_axes),
        "metrics": {m: {"better": d} for m, d in SUMMARY_METRICS.items()},
        "cells": entries,
        "deltas": deltas,
        "note": note,
    }
    if "case" in client_axes:
        found = symptoms.fixed_delay(results)
        if found is not None:
            summary["symptoms"] = {"fixed_delay": found}
    if bootstrap is not None:
        summary["method"] = stats.method(
            bootstrap=bootstrap,
            repeats=[c["n"] for c in entries],
            resampled=_resampled(entries),
        )
    return summary


def write_summary(summary: Mapping[str, Any], path: str | Path) -> None:
    """Write summary.json atomically; strict JSON (no NaN/Infinity), numpy values unwrapped
    and NaN/NA as null (_py), keys as strings, indented by 2."""
    write_text_atomic(path, indented_json(summary, leaf=_py) + "\n")


def read_summary(path: str | Path) -> dict[str, Any]:
    """Read summary.json."""
    return json.loads(Path(path).read_text())


def warmups(records: Sequence[str | Path]) -> list[dict[str, Any]]:
    """The warm-up request(s) recorded after each server start (service/<server>/warmup.jsonl,
    RunPaths.service_files), apart from the figures."""
    out = []
    for path in sorted(map(Path, records)):
        record = read_record(path)
        out.append(
            {
                "server_id": path.parent.name,
                "requests": record.completed,
                "ttft_ms": record.mean_ttft_ms,
                "e2e_ms": record.mean_e2e_latency_ms,
            }
        )
    return out
