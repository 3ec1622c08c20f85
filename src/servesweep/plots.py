"""Seaborn figures from results.csv and summary.json: pure functions returning Figures."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from servesweep.analysis import SUMMARY_METRICS
from servesweep.files import atomic_open

# Figures are built on matplotlib.figure.Figure directly (no pyplot state, no GUI backend);
# PNGs are rendered by the Agg canvas that savefig picks for the format.

log = logging.getLogger(__name__)

OUTCOME_COLORS = {"better": "#1b9e77", "worse": "#d95f02", "no change": "#7f7f7f"}
DPI = 120


def _direction(metric: str) -> str | None:
    if metric in SUMMARY_METRICS:
        return SUMMARY_METRICS[metric]
    if metric.endswith("_ms") or metric.endswith("_s"):
        return "lower"
    if metric.endswith("_tps"):
        return "higher"
    return None


def _message(ax: Axes, text: str) -> None:
    ax.set_axis_off()
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True, fontsize=11)


def _baseline_text(summary: Mapping[str, Any]) -> str:
    base = summary.get("baseline") or {}
    return ", ".join(f"{k}={v}" for k, v in base.items()) or "none"


def _outcome(m: Mapping[str, Any]) -> str:
    if m["delta_abs"] == 0:
        return "no change"
    return "better" if m["better"] else "worse"


def _short_label(axes: Mapping[str, Any], baseline: Mapping[str, Any]) -> str:
    """Candidate value of the baseline axis on line 1, the other axes (k=v) on line 2."""
    first = [str(axes[k]) for k in baseline if k in axes]
    rest = ", ".join(f"{k}={v}" for k, v in axes.items() if k not in baseline)
    return "\n".join(part for part in (" ".join(first), rest) if part) or "default"


def _delta_rows(summary: Mapping[str, Any], metric: str) -> pd.DataFrame:
    rows = []
    for delta in summary.get("deltas") or []:
        m = (delta.get("metrics") or {}).get(metric)
        if not m or m.get("delta_pct") is None:
            continue
        label = _short_label(delta["axes"], summary.get("baseline") or {})
        rows.append({"cell": label, "delta_pct": m["delta_pct"], "outcome": _outcome(m)})
    return pd.DataFrame(rows, columns=["cell", "delta_pct", "outcome"])


def plot_deltas(summary: Mapping[str, Any], *, metric: str) -> Figure:
    """Horizontal bars: change of `metric` (median over repeats, %) per candidate cell.

    Without deltas (no baseline in the run, or only the baseline ran) the figure says why.
    """
    rows = _delta_rows(summary, metric)
    fig = Figure(figsize=(10, 2.0 + 0.65 * max(len(rows), 2)), layout="constrained")
    ax = fig.subplots()
    fig.suptitle(f"{metric}: change of the median vs baseline {_baseline_text(summary)}")
    if rows.empty:
        why = summary.get("note") or f"no {metric} deltas in this run"
        _message(ax, f"No deltas to plot.\n{why}")
        return fig
    direction = _direction(metric)
    sns.barplot(
        data=rows,
        x="delta_pct",
        y="cell",
        hue="outcome",
        palette=OUTCOME_COLORS,
        hue_order=[o for o in OUTCOME_COLORS if o in set(rows["outcome"])],
        dodge=False,
        orient="h",
        ax=ax,
    )
    for container in ax.containers:
        ax.bar_label(container, fmt="%+.1f%%", padding=3, fontsize=9)
    ax.axvline(0, color="black", linewidth=1)
    lo, hi = min(rows["delta_pct"].min(), 0), max(rows["delta_pct"].max(), 0)
    pad = 0.4 * max(hi - lo, 1.0)
    ax.set_xlim(lo - pad, hi + pad)
    sign = {"lower": "negative", "higher": "positive"}.get(direction or "")
    rule = f"\n{direction} is better: {sign} bars are improvements" if sign else ""
    ax.set_xlabel(f"change vs baseline, % = 100 x (candidate - baseline) / baseline{rule}")
    ax.set_ylabel("candidate cell")
    ax.legend(title=None, loc="best", fontsize=9)
    return fig


def _check_columns(results: pd.DataFrame, **columns: str | None) -> None:
    missing = {k: v for k, v in columns.items() if v is not None and v not in results.columns}
    if missing:
        raise ValueError(
            f"results have no column(s) {missing}; columns are {list(results.columns)}"
        )


def plot_metric_vs(
    results: pd.DataFrame,
    *,
    metric: str,
    x: str = "concurrency",
    hue: str | None = None,
    col: str | None = None,
) -> Figure:
    """`metric` against a client axis: one point per repeat, a line through the medians.

    One panel per value of `col` (e.g. the other server axis), one colour per value of `hue`
    (e.g. the baseline axis).
    """
    _check_columns(results, metric=metric, x=x, hue=hue, col=col)
    data = results.dropna(subset=[metric]).copy()
    panels = list(dict.fromkeys(data[col])) if col and not data.empty else [None]
    fig = Figure(figsize=(max(6.5, 1.5 + 4.2 * len(panels)), 4.6), layout="constrained")
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    direction = _direction(metric)
    fig.suptitle(
        f"{metric} vs {x}\ndots = repeats, line = median over repeats"
        + (f"; {direction} is better" if direction else "")
    )
    if data.empty:
        _message(axes[0], f"no {metric} values in the results")
        return fig
    if hue:
        data[hue] = data[hue].map(str)
    hue_order = list(dict.fromkeys(data[hue])) if hue else None
    palette = (
        dict(zip(hue_order, sns.color_palette("colorblind", len(hue_order)), strict=True))
        if hue_order
        else None
    )
    numeric_x = pd.api.types.is_numeric_dtype(data[x])
    for i, (ax, panel) in enumerate(zip(axes, panels, strict=True)):
        sub = data if panel is None else data[data[col] == panel]
        keys = [hue, x] if hue else [x]
        medians = sub.groupby(keys, sort=True)[metric].median().reset_index()
        common = {"x": x, "y": metric, "hue": hue, "hue_order": hue_order, "palette": palette}
        sns.lineplot(data=medians, marker="o", ax=ax, legend=i == len(panels) - 1, **common)
        sns.scatterplot(data=sub, alpha=0.55, s=28, ax=ax, legend=False, **common)
        if numeric_x:
            ax.set_xticks(sorted(set(data[x])))
        ax.set_title(f"{col}={panel}" if panel is not None else "", fontsize=10)
        ax.set_xlabel(x)
        ax.set_ylabel(metric)
        ax.grid(True, alpha=0.3)
    return fig


def save_figure(fig: Figure, path: str | Path) -> None:
    """Write a figure as PNG atomically."""
    with atomic_open(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=DPI)
    log.info("wrote %s", path)
