"""Cross-run comparison: the same cells (server id + client id) of run B against run A."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from servesweep.analysis import labels, stats, summary
from servesweep.analysis.planned import run_inputs  # noqa: F401 (re-exported)
from servesweep.analysis.results import (
    CHECK_COLUMNS,
    DERIVED,
    ENGINE_COLUMNS,
    FIGURE_COLUMNS,
    GPU_COLUMNS,
    HYGIENE_COLUMNS,
    ID_COLUMNS,
    LAYOUT_ARGS,
    METRICS,
    SIM_COLUMNS,
    read_requests_csv,
    read_results_csv,
)
from servesweep.core.files import atomic_open

log = logging.getLogger(__name__)

MATCHED_BY = "server_id + client_id"
DIRECTION = (
    "delta_pct = 100 x (B - A) / A of the medians over repeats, so its sign is the sign of "
    "the raw change; verdict `better` means run B is better than run A on that metric"
)
TABLE_COLUMNS = [
    "run_a",
    "run_b",
    "server_id",
    "client_id",
    "label",
    "metric",
    "better_is",
    "n_a",
    "n_b",
    "median_a",
    "median_b",
    "delta_pct",
    "ci_low",
    "ci_high",
    "verdict",
    "coarse",
    "resampled",
    "fingerprint_a",
    "fingerprint_b",
    "fingerprint_changed",
    "what_changed",
]
Cell = tuple[str, str]


# ---------------------------------------------------------------- inputs (I/O edge)


def load_run(
    *, results_csv: str | Path, requests_csv: str | Path | None
) -> tuple[pd.DataFrame, dict[tuple[str, str, int], stats.Requests | None]]:
    """results.csv of a run and the per-request data of its requests.csv (None: none)."""
    results = read_results_csv(results_csv)
    requests = read_requests_csv(requests_csv) if requests_csv is not None else None
    return results, summary.load_requests(results=results, requests=requests)


# ---------------------------------------------------------------- comparison (pure)


def axis_columns(results: pd.DataFrame, *, server_id: str | None = None) -> list[str]:
    """The matrix-axis columns of a results table (neither ids, engine, metrics nor GPU
    figures); a parallel-layout column (tp_size, ...) only where `server_id` names it, i.e.
    where the matrix varied it."""
    other = {
        *ID_COLUMNS,
        *ENGINE_COLUMNS,
        *METRICS,
        *DERIVED,
        *GPU_COLUMNS,
        *FIGURE_COLUMNS,
        *SIM_COLUMNS,
        *HYGIENE_COLUMNS,
        *CHECK_COLUMNS,
        "outputs_verdict",  # the equivalence verdict of the row's server config
    }
    return [
        c
        for c in results.columns
        if c not in other and (c not in LAYOUT_ARGS or f"{c}~" in (server_id or ""))
    ]


# Columns that describe a server config beside its fingerprint: what a changed one shows.
DESCRIBED_BY = ("engine_kind", "sim_time_scale", *LAYOUT_ARGS)


def _values(rows: pd.DataFrame, column: str) -> str:
    return ",".join(sorted({str(summary.json_value(v)) for v in rows[column]}))


def what_changed(rows_a: pd.DataFrame, rows_b: pd.DataFrame) -> str:
    """`ep_size 8 -> 4` for the DESCRIBED_BY columns that differ between two runs' rows of a
    cell; otherwise where to look (the fingerprint also covers the image, engine version and
    every other server argument)."""
    diffs = [
        f"{c} {_values(rows_a, c)} -> {_values(rows_b, c)}"
        for c in DESCRIBED_BY
        if c in rows_a.columns and c in rows_b.columns and _values(rows_a, c) != _values(rows_b, c)
    ]
    return "; ".join(diffs) or "image, engine version or server arguments (manifest.json)"


def cells_of(results: pd.DataFrame) -> dict[Cell, pd.DataFrame]:
    """Repeat rows per (server_id, client_id), in table order."""
    if results.empty:
        return {}
    keys = list(
        zip(results["server_id"].astype(str), results["client_id"].astype(str), strict=True)
    )
    positions: dict[Cell, list[int]] = {}
    for pos, key in enumerate(keys):
        positions.setdefault(key, []).append(pos)
    return {key: results.iloc[pos] for key, pos in positions.items()}


def _fingerprint(rows: pd.DataFrame) -> str | None:
    if "fingerprint" not in rows:
        return None
    values = sorted({str(v) for v in rows["fingerprint"].dropna()})
    return ",".join(values) or None


def _run_id(results: pd.DataFrame, fallback: str) -> str:
    ids = sorted({str(r) for r in results["run_id"]}) if "run_id" in results else []
    return ids[0] if len(ids) == 1 else fallback


def _cell_entry(
    key: Cell,
    rows_a: pd.DataFrame,
    rows_b: pd.DataFrame,
    *,
    seeds: tuple[str, str],
    requests: tuple[summary.RequestData | None, summary.RequestData | None],
    bootstrap: stats.Bootstrap,
    metrics: Sequence[str] | None,
) -> dict[str, Any]:
    names_a, names_b = summary.cell_metric_names(rows_a), summary.cell_metric_names(rows_b)
    names = [m for m in names_a if m in names_b and (metrics is None or m in metrics)]
    axes_cols = [c for c in axis_columns(rows_b, server_id=key[0]) if c in rows_a.columns]
    first = rows_b.iloc[0]
    axes = {c: summary.json_value(first[c]) for c in axes_cols if pd.notna(first[c])}
    reps = []
    for rows, seed, reqs in zip((rows_a, rows_b), seeds, requests, strict=True):
        reps.append(
            summary.cell_replicates(
                rows,
                metrics=names,
                requests=reqs,
                bootstrap=bootstrap,
                key=f"{seed}|{key[0]}|{key[1]}",
            )
        )
    fp_a, fp_b = _fingerprint(rows_a), _fingerprint(rows_b)
    out: dict[str, Any] = {
        "server_id": key[0],
        "client_id": key[1],
        "label": summary.cell_label(axes) if axes else f"{key[0]} / {key[1]}",
        "axes": axes,
        "fingerprint_a": fp_a,
        "fingerprint_b": fp_b,
        "fingerprint_changed": fp_a != fp_b,
        "what_changed": what_changed(rows_a, rows_b) if fp_a != fp_b else None,
        "n_a": len(rows_a),
        "n_b": len(rows_b),
        "coarse": stats.is_coarse(len(rows_a)) or stats.is_coarse(len(rows_b)),
        "metrics": {},
    }
    for m in names:
        d = summary.compare(
            rows_b[m],
            rows_a[m],
            better=summary.SUMMARY_METRICS[m],
            candidate_replicates=reps[1][m],
            baseline_replicates=reps[0][m],
            level=bootstrap.level,
        )
        kinds = {r[m].resampled if r[m] is not None else None for r in reps}
        out["metrics"][m] = {
            "median_a": d["baseline_median"],
            "median_b": d["candidate_median"],
            "delta_abs": d["delta_abs"],
            "delta_pct": d["delta_pct"],
            "ci_low": d["ci_low"],
            "ci_high": d["ci_high"],
            "verdict": d["verdict"],
            "p_value": d["p_value"],
            "better": d["better"],
            "resampled": kinds.pop() if len(kinds) == 1 else "mixed",
        }
    return out


def compare_runs(
    *,
    results_a: pd.DataFrame,
    results_b: pd.DataFrame,
    run_a: str,
    run_b: str,
    requests_a: summary.RequestData | None = None,
    requests_b: summary.RequestData | None = None,
    bootstrap: stats.Bootstrap = stats.DEFAULT,
    metrics: Sequence[str] | None = None,
) -> dict[str, Any]:
    """JSON-ready comparison of run B against run A, cell by cell (matched by ids).

    Per common cell and metric: medians over repeats of A and B, % delta of B vs A, its
    bootstrap interval (both runs resampled independently, requests within repeats where
    `requests_*` has them) and a verdict. Fingerprints are listed: they are expected to
    differ when B changed what a server runs (image, engine version, arguments).
    """
    cells_a, cells_b = cells_of(results_a), cells_of(results_b)
    common = [k for k in cells_b if k in cells_a]
    seed_a, seed_b = _run_id(results_a, run_a), _run_id(results_b, run_b)
    if seed_a == seed_b:
        seed_b += "|B"  # the same run twice: still draw independent streams
    entries = [
        _cell_entry(
            key,
            cells_a[key],
            cells_b[key],
            seeds=(seed_a, seed_b),
            requests=(requests_a, requests_b),
            bootstrap=bootstrap,
            metrics=metrics,
        )
        for key in common
    ]
    stats.control_fdr([m for e in entries for m in e["metrics"].values()], level=bootstrap.level)
    fingerprints: dict[str, dict[str, Any]] = {}
    for e in entries:
        fingerprints.setdefault(
            e["server_id"],
            {
                "server_id": e["server_id"],
                "fingerprint_a": e["fingerprint_a"],
                "fingerprint_b": e["fingerprint_b"],
                "changed": e["fingerprint_changed"],
                "what_changed": e["what_changed"],
            },
        )
    used = [m for m in summary.SUMMARY_METRICS if any(m in e["metrics"] for e in entries)]
    counts = {
        m: {
            v: sum(e["metrics"].get(m, {}).get("verdict") == v for e in entries)
            for v in stats.VERDICTS
        }
        for m in used
    }
    note = None
    if not common:
        note = f"no cells in common (matched by {MATCHED_BY})"
    elif any(f["changed"] for f in fingerprints.values()):
        note = "server fingerprints differ (expected when run B changed the image or arguments)"
    log.info("compared %d common cells of %s and %s", len(entries), run_a, run_b)
    return {
        "run_a": run_a,
        "run_b": run_b,
        "matched_by": MATCHED_BY,
        "engines": {"a": labels.engine_of(results_a), "b": labels.engine_of(results_b)},
        "direction": DIRECTION,
        "metrics": {m: {"better": summary.SUMMARY_METRICS[m]} for m in used},
        "cells": entries,
        "only_in_a": [
            {"server_id": s, "client_id": c} for s, c in cells_a if (s, c) not in cells_b
        ],
        "only_in_b": [
            {"server_id": s, "client_id": c} for s, c in cells_b if (s, c) not in cells_a
        ],
        "fingerprints": list(fingerprints.values()),
        "verdict_counts": counts,
        "note": note,
        "method": stats.method(
            bootstrap=bootstrap,
            repeats=[n for e in entries for n in (e["n_a"], e["n_b"])],
            resampled=_resampled(entries),
        ),
    }


def _resampled(entries: Sequence[Mapping[str, Any]]) -> dict[str, str | None]:
    seen: dict[str, set[str | None]] = {}
    for e in entries:
        for m, d in e["metrics"].items():
            seen.setdefault(m, set()).add(d["resampled"])
    return {m: v.pop() if len(v) == 1 else "mixed" for m, v in seen.items()}


def comparison_table(comparison: Mapping[str, Any]) -> pd.DataFrame:
    """comparison.csv: one row per common cell and metric."""
    rows = []
    for cell in comparison.get("cells") or []:
        for metric, d in cell["metrics"].items():
            rows.append(
                {
                    "run_a": comparison["run_a"],
                    "run_b": comparison["run_b"],
                    "server_id": cell["server_id"],
                    "client_id": cell["client_id"],
                    "label": cell["label"],
                    "metric": metric,
                    "better_is": summary.SUMMARY_METRICS.get(metric),
                    "n_a": cell["n_a"],
                    "n_b": cell["n_b"],
                    **{k: d[k] for k in ("median_a", "median_b", "delta_pct")},
                    **{k: d[k] for k in ("ci_low", "ci_high", "verdict")},
                    "coarse": cell["coarse"],
                    "resampled": d["resampled"],
                    "fingerprint_a": cell["fingerprint_a"],
                    "fingerprint_b": cell["fingerprint_b"],
                    "fingerprint_changed": cell["fingerprint_changed"],
                    "what_changed": cell.get("what_changed"),
                }
            )
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def write_comparison(comparison: Mapping[str, Any], path: str | Path) -> None:
    """Write comparison.json atomically; strict JSON (no NaN/Infinity)."""
    summary.write_summary(comparison, path)


def write_table(table: pd.DataFrame, path: str | Path) -> None:
    """Write comparison.csv atomically."""
    with atomic_open(path) as fh:
        table.to_csv(fh, index=False)
