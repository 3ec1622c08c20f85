"""Seaborn figures from results.csv and summary.json: pure functions returning Figures."""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from servesweep.analysis import labels, stats
from servesweep.analysis.summary import SUMMARY_METRICS
from servesweep.core.files import atomic_open
from servesweep.measure import servermetrics

# Figures are built on matplotlib.figure.Figure directly (no pyplot state, no GUI backend);
# PNGs are rendered by the Agg canvas that savefig picks for the format.

log = logging.getLogger(__name__)

# Verdict colours (stats.VERDICTS); OUTCOME_COLORS is the older name.
VERDICT_COLORS = {
    stats.BETTER: "#1b9e77",
    stats.WORSE: "#d95f02",
    stats.NOISE: "#8c8c8c",
    stats.UNKNOWN: "#d0d0d0",
}
OUTCOME_COLORS = VERDICT_COLORS
DPI = 120
DELTA_COLUMNS = ["cell", "delta_pct", "ci_low", "ci_high", "verdict", "baseline"]
# Bars per delta panel: a bar a cell is unreadable beyond this, and at 10k cell-repeats the
# figure would be 78,000 px tall (benchmarks/large_run.py). Larger matrices show the largest
# changes; summary.json / comparison.json have them all.
MAX_DELTA_ROWS = 40
# A tick per client-axis value up to this many values; beyond, matplotlib's own ticks.
MAX_X_TICKS = 12


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


def _verdict(m: Mapping[str, Any]) -> str:
    """The delta's verdict; `unknown` for summaries written before intervals existed."""
    v = m.get("verdict")
    return v if v in VERDICT_COLORS else stats.UNKNOWN


def _short_label(axes: Mapping[str, Any], baseline: Mapping[str, Any]) -> str:
    """Candidate value of the baseline axis on line 1, the other axes (k=v) on line 2."""
    first = [str(axes[k]) for k in baseline if k in axes]
    rest = ", ".join(f"{k}={v}" for k, v in axes.items() if k not in baseline)
    return "\n".join(part for part in (" ".join(first), rest) if part) or "default"


def _delta_row(cell: str, m: Mapping[str, Any], baseline: float | None) -> dict[str, Any]:
    return {
        "cell": cell,
        "delta_pct": m["delta_pct"],
        "ci_low": m.get("ci_low"),
        "ci_high": m.get("ci_high"),
        "verdict": _verdict(m),
        "baseline": baseline,
    }


def _delta_rows(summary: Mapping[str, Any], metric: str) -> pd.DataFrame:
    rows = []
    for delta in summary.get("deltas") or []:
        m = (delta.get("metrics") or {}).get(metric)
        if not m or m.get("delta_pct") is None:
            continue
        label = _short_label(delta["axes"], summary.get("baseline") or {})
        rows.append(_delta_row(label, m, m.get("baseline_median")))
    return pd.DataFrame(rows, columns=DELTA_COLUMNS)


def _largest(rows: pd.DataFrame, limit: int = MAX_DELTA_ROWS) -> tuple[pd.DataFrame, str]:
    """At most `limit` rows, those with the largest |delta| (in their order), and a note
    saying so; all rows and no note when they fit."""
    if len(rows) <= limit:
        return rows, ""
    size = pd.to_numeric(rows["delta_pct"], errors="coerce").abs().fillna(-1.0)
    keep = size.sort_values(ascending=False, kind="stable").index[:limit]
    return rows.loc[sorted(keep)], f"; the {limit} largest |changes| of {len(rows)} cells"


def _interval_text(delta: float, low: float, high: float, verdict: str) -> str:
    text = f"{labels.pct(delta)}%"
    if np.isfinite(low) and np.isfinite(high):
        text += f" [{labels.pct(low)}, {labels.pct(high)}]"
    return f"{text} {verdict}"


def _sim_title(engine: Mapping[str, Any]) -> str:
    """A title line saying the figures are simulated ('' for a real engine)."""
    note = labels.sim_note(engine)
    return f"\n{note}" if note else ""


def _sim_engine(engines: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any]:
    """The sim engine of a comparison's runs (run A's if both), {} when neither is simulated."""
    return next((e for e in engines.values() if e.get("kind") == "sim"), {})


def _draw_deltas(
    ax: Axes, rows: pd.DataFrame, *, metric: str, of: str = "baseline", legend: bool = True
) -> None:
    """Bars of % delta (one colour per verdict), whiskers for the interval, a zero line;
    beside each bar its text and the absolute value it is a % `of` (the baseline's median).

    Rows without a delta keep their place (empty), so panels sharing a y axis line up.
    """
    rows = rows.reset_index(drop=True)
    pos = np.arange(len(rows), dtype=float)
    delta = pd.to_numeric(rows["delta_pct"], errors="coerce").to_numpy(float)
    low = pd.to_numeric(rows["ci_low"], errors="coerce").to_numpy(float)
    high = pd.to_numeric(rows["ci_high"], errors="coerce").to_numpy(float)
    has_delta = np.isfinite(delta)
    for verdict, color in VERDICT_COLORS.items():
        mask = has_delta & (rows["verdict"] == verdict).to_numpy()
        if mask.any():
            ax.barh(pos[mask], delta[mask], height=0.6, color=color, label=verdict)
    has_ci = has_delta & np.isfinite(low) & np.isfinite(high)
    if has_ci.any():
        ax.hlines(pos[has_ci], low[has_ci], high[has_ci], color="black", linewidth=1.4)
        for ends in (low, high):
            ax.plot(ends[has_ci], pos[has_ci], "|", color="black", markersize=9)
    ax.axvline(0, color="black", linewidth=1)
    ax.set_yticks(pos, labels=list(rows["cell"]))
    ax.set_ylim(len(rows) - 0.5, -0.5)  # first cell on top
    values = np.concatenate([delta[has_delta], low[has_ci], high[has_ci], [0.0]])
    lo, hi = float(values.min()), float(values.max())
    span = max(hi - lo, 1.0)
    ax.set_xlim(lo - 0.1 * span, hi + 1.1 * span)
    base = pd.to_numeric(rows["baseline"], errors="coerce").to_numpy(float)
    for i in np.flatnonzero(has_delta):
        right = float(np.nanmax([delta[i], high[i], 0.0]))
        text = _interval_text(delta[i], low[i], high[i], rows["verdict"].iloc[i])
        if np.isfinite(base[i]):
            text += f"\nof {of} {labels.value_text(float(base[i]), metric)}"
        ax.text(right + 0.02 * span, pos[i], text, va="center", fontsize=8)
    ax.grid(True, axis="x", alpha=0.3)
    if legend and has_delta.any():
        ax.legend(title=None, loc="lower right", fontsize=8)


def _rule_text(direction: str | None) -> str:
    sign = {"lower": "negative", "higher": "positive"}.get(direction or "")
    return f"\n{direction} is better: {sign} bars are improvements" if sign else ""


def _coarse_text(entries: Sequence[Mapping[str, Any]], n_keys: Sequence[str]) -> str:
    if not any(e.get("coarse") for e in entries):
        return ""
    ns = sorted({int(e[k]) for e in entries for k in n_keys if e.get(k) is not None})
    return f"; coarse intervals (repeats per cell: {'/'.join(map(str, ns))}, see method)"


def plot_deltas(
    summary: Mapping[str, Any], *, metric: str, engine: Mapping[str, Any] | None = None
) -> Figure:
    """Horizontal bars: change of `metric` (median over repeats, %) per candidate cell, with
    the baseline's median beside each; `engine` ({kind, time_scale}): a sim says so.

    Whiskers are the bootstrap interval of the % delta, colour and legend the verdict
    (better / worse / within noise / unknown). Without deltas (no baseline in the run, or
    only the baseline ran) the figure says why; the workflow draws none then.
    """
    rows, shown = _largest(_delta_rows(summary, metric))
    fig = Figure(figsize=(10, 2.4 + 0.65 * max(len(rows), 2)), layout="constrained")
    ax = fig.subplots()
    level = (summary.get("method") or {}).get("level", stats.LEVEL)
    coarse = _coarse_text(summary.get("deltas") or [], ("n_candidate", "n_baseline"))
    fig.suptitle(
        f"{labels.label(metric)}: change of the median vs baseline "
        f"{_baseline_text(summary)}{shown}\n"
        f"whiskers: {100 * level:g}% bootstrap interval; colour: verdict{coarse}"
        + _sim_title(engine or {})
    )
    if rows.empty:
        why = summary.get("note") or f"no {metric} deltas in this run"
        _message(ax, f"No deltas to plot.\n{why}")
        return fig
    _draw_deltas(ax, rows, metric=metric)
    ax.set_xlabel(
        "change vs baseline, % = 100 x (candidate - baseline) / baseline"
        + _rule_text(_direction(metric))
    )
    ax.set_ylabel("candidate cell")
    return fig


def _comparison_rows(comparison: Mapping[str, Any], metric: str) -> pd.DataFrame:
    rows = []
    for cell in comparison.get("cells") or []:
        m = (cell.get("metrics") or {}).get(metric) or {}
        label = cell.get("label") or f"{cell.get('server_id')} / {cell.get('client_id')}"
        label = textwrap.fill(label, 48)
        if cell.get("fingerprint_changed"):
            label += "\n* " + textwrap.shorten(cell.get("what_changed") or "server config", 48)
        if m.get("delta_pct") is None:
            rows.append(
                {
                    "cell": label,
                    "delta_pct": None,
                    "ci_low": None,
                    "ci_high": None,
                    "verdict": stats.UNKNOWN,
                    "baseline": None,
                }
            )
        else:
            rows.append(_delta_row(label, m, m.get("median_a")))
    return pd.DataFrame(rows, columns=DELTA_COLUMNS)


def plot_comparison(
    comparison: Mapping[str, Any], *, metrics: Sequence[str] | None = None
) -> Figure:
    """One panel per metric (stacked): % delta of run B vs run A per common cell.

    Whiskers are the bootstrap interval, colour the verdict for B; `*` marks cells whose
    server fingerprint differs between the runs.
    """
    metrics = list(metrics or comparison.get("metrics") or SUMMARY_METRICS)
    cells = comparison.get("cells") or []
    a, b = comparison.get("run_a"), comparison.get("run_b")
    panel = 1.3 + 0.55 * min(max(len(cells), 1), MAX_DELTA_ROWS)
    fig = Figure(figsize=(11, 1.2 + panel * len(metrics)), layout="constrained")
    axes = fig.subplots(len(metrics), 1, squeeze=False)[:, 0]
    level = (comparison.get("method") or {}).get("level", stats.LEVEL)
    coarse = _coarse_text(cells, ("n_a", "n_b"))
    fig.suptitle(
        f"run {b} vs run {a}: % change of the median per cell = 100 x (B - A) / A\n"
        f"whiskers: {100 * level:g}% bootstrap interval; colour: verdict for B\n"
        f"* = server fingerprint differs, and what differs{coarse}"
        + _sim_title(_sim_engine(comparison.get("engines") or {}))
    )
    if not cells:
        _message(axes[0], f"No cells in common.\n{comparison.get('note') or ''}")
        for ax in axes[1:]:
            ax.set_axis_off()
        return fig
    shown: set[str] = set()
    for ax, metric in zip(axes, metrics, strict=True):
        rows, largest = _largest(_comparison_rows(comparison, metric))
        _draw_deltas(ax, rows, metric=metric, of=f"run {a}", legend=False)
        shown |= set(rows.loc[rows["delta_pct"].notna(), "verdict"])
        direction = _direction(metric)
        title = labels.label(metric) + (f" ({direction} is better)" if direction else "")
        ax.set_title(title + largest, fontsize=10)
        ax.set_xlabel(f"% change, run {b} vs {a}", fontsize=9)
    handles = [Patch(color=c, label=v) for v, c in VERDICT_COLORS.items() if v in shown]
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=9)
    return fig


def _check_columns(results: pd.DataFrame, **columns: str | None) -> None:
    missing = {k: v for k, v in columns.items() if v is not None and v not in results.columns}
    if missing:
        raise ValueError(
            f"results have no column(s) {missing}; columns are {list(results.columns)}"
        )


def _draw_series(
    ax: Axes,
    data: pd.DataFrame,
    *,
    metric: str,
    x: str,
    hue: str | None,
    hue_order: Sequence[str] | None,
    palette: Mapping[str, Any] | None,
    legend: bool,
) -> None:
    """Medians over repeats as a line with hollow markers, each repeat as a dot drawn on top
    (so no median marker hides a repeat); y from zero."""
    keys = [hue, x] if hue else [x]
    medians = data.groupby(keys, sort=True)[metric].median().reset_index()
    common = {"x": x, "y": metric, "hue": hue, "hue_order": hue_order, "palette": palette}
    sns.lineplot(
        data=medians,
        marker="o",
        markersize=10,
        markerfacecolor="none",
        markeredgewidth=1.5,
        ax=ax,
        legend=legend,
        zorder=2,
        **common,
    )
    for line in ax.lines:  # seaborn draws marker edges white: open circles need the line's colour
        line.set_markeredgecolor(line.get_color())
    for handle in ax.get_legend().legend_handles if ax.get_legend() else []:
        if hasattr(handle, "set_markeredgecolor"):
            handle.set_markeredgecolor(handle.get_color())
    sns.scatterplot(data=data, s=22, ax=ax, legend=False, zorder=3, edgecolor="none", **common)
    ax.grid(True, alpha=0.3)


def _y_from_zero(axes: Sequence[Axes], values: pd.Series) -> None:
    """y from zero (or the lowest value, if negative) to above the highest of `values`, set
    once every panel sharing the axis is drawn: a limit set while drawing the first panel
    freezes its top, and a higher line in a later panel is cut off."""
    finite = pd.to_numeric(values, errors="coerce").dropna()
    if finite.empty:
        return
    low, high = min(0.0, float(finite.min())), max(0.0, float(finite.max()))
    pad = 0.05 * (high - low) or 1.0
    for ax in axes:
        ax.set_ylim(low if low == 0 else low - pad, high + pad)


def plot_metric_vs(
    results: pd.DataFrame,
    *,
    metric: str,
    x: str = "concurrency",
    hue: str | None = None,
    col: str | None = None,
) -> Figure:
    """`metric` against a client axis: one dot per repeat, a line through the medians (hollow
    markers), y from zero, axes labelled with units; a sim run's title says "simulated".

    One panel per value of `col` (e.g. the other server axis), one colour per value of `hue`
    (e.g. the baseline axis).
    """
    _check_columns(results, metric=metric, x=x, hue=hue, col=col)
    data = results.dropna(subset=[metric]).copy()
    panels = list(dict.fromkeys(data[col])) if col and not data.empty else [None]
    fig = Figure(figsize=(max(6.5, 1.5 + 4.2 * len(panels)), 4.8), layout="constrained")
    axes = fig.subplots(1, len(panels), sharey=True, squeeze=False)[0]
    direction = _direction(metric)
    fig.suptitle(
        f"{labels.label(metric)} vs {labels.label(x)}\n"
        "dots = repeats, line with open circles = median over repeats"
        + (f"; {direction} is better" if direction else "")
        + _sim_title(labels.engine_of(results))
    )
    if data.empty:
        _message(axes[0], f"no {labels.label(metric)} values in the results")
        return fig
    if hue:
        data[hue] = data[hue].map(str)
    hue_order = list(dict.fromkeys(data[hue])) if hue else None
    palette = (
        dict(zip(hue_order, sns.color_palette("colorblind", len(hue_order)), strict=True))
        if hue_order
        else None
    )
    tick_each_x = pd.api.types.is_numeric_dtype(data[x]) and data[x].nunique() <= MAX_X_TICKS
    for i, (ax, panel) in enumerate(zip(axes, panels, strict=True)):
        sub = data if panel is None else data[data[col] == panel]
        _draw_series(
            ax,
            sub,
            metric=metric,
            x=x,
            hue=hue,
            hue_order=hue_order,
            palette=palette,
            legend=i == len(panels) - 1,
        )
        if tick_each_x:
            ax.set_xticks(sorted(set(data[x])))
        ax.set_title(f"{col}={panel}" if panel is not None else "", fontsize=10)
        ax.set_xlabel(labels.label(x))
        ax.set_ylabel(labels.label(metric))
    _y_from_zero(axes, data[metric])
    return fig


# The energy and goodput page (report category "Energy and goodput"): results.csv columns.
ENERGY_PAGE_METRICS = (
    "gpu_power_mean_w",
    "joules_per_input_token",
    "joules_per_output_token",
    "output_tokens_per_watt",
    "goodput_rps",
    "slo_pct",
)


def plot_energy_goodput(
    results: pd.DataFrame,
    *,
    x: str = "concurrency",
    hue: str | None = None,
    col: str | None = None,
) -> Figure:
    """Energy, efficiency and goodput against a client axis: a row per metric, a panel per
    value of `col` (as the metric-vs plots: cells of different `col` are never pooled into
    one line), a colour per value of `hue`; medians over repeats, dots = repeats. The title
    says where the power came from (`gpu_source`): figures of the local sim are simulated,
    never measured."""
    metrics = ENERGY_PAGE_METRICS
    data = results.copy()
    if hue and hue in data.columns:
        data[hue] = data[hue].map(str)
    else:
        hue = None
    col = col if col and col in data.columns else None
    panels = list(dict.fromkeys(data[col])) if col and not data.empty else [None]
    fig = Figure(
        figsize=(max(6.5, 1.5 + 4.2 * len(panels)), 2.6 * len(metrics) + 1.2),
        layout="constrained",
    )
    grid = fig.subplots(len(metrics), len(panels), squeeze=False, sharey="row")
    sources = sorted({str(v) for v in results.get("gpu_source", pd.Series(dtype=str)).dropna()})
    saturated = results.get("client_saturated", pd.Series(dtype=object))
    n_saturated = int((saturated.astype(str) == "True").sum())
    width_in = fig.get_figwidth()
    title = (
        f"Energy and goodput vs {labels.label(x)} (GPU power: {', '.join(sources) or 'none'})\n"
        "dots = repeats, line with open circles = median"
        + (f"; a panel per {col}" if col else "")
        + _sim_title(labels.engine_of(results))
        + (f"\nCLIENT SATURATED in {n_saturated} cell-repeat(s): client_saturated in results.csv"
           if n_saturated else "")
    )  # fmt: skip
    fig.suptitle(_fit(title, width_in=width_in - 0.3, fontsize=12), fontsize=12)
    panel_in = (width_in - 0.3) / len(panels) - 0.9  # less the y axis' labels
    for row, metric in zip(grid, metrics, strict=True):
        values = data.dropna(subset=[metric]) if metric in data.columns else data.iloc[:0]
        order = list(dict.fromkeys(values[hue])) if hue else None
        better = _direction(metric) or "see docs/energy.md"
        for j, (ax, panel) in enumerate(zip(row, panels, strict=True)):
            sub = values if panel is None else values[values[col] == panel]
            where = f"{col}={panel}: " if panel is not None else ""
            panel_title = f"{where}{labels.label(metric)} ({better} is better)"
            ax.set_title(_fit(panel_title, width_in=panel_in, fontsize=9), fontsize=9)
            if sub.empty or x not in sub.columns:
                why = " (no SLO configured)" if "slo" in metric or "goodput" in metric else ""
                _message(ax, f"no {labels.label(metric)} values{why}")
                continue
            _draw_series(
                ax,
                sub,
                metric=metric,
                x=x,
                hue=hue,
                hue_order=order,
                palette=None,
                legend=j == len(panels) - 1,
            )
            ax.set_xlabel(labels.label(x))
            ax.set_ylabel(labels.label(metric))
        if not values.empty:
            _y_from_zero(row, values[metric])
    return fig


def plot_ttft_breakdown(results: pd.DataFrame) -> Figure:
    """PD: a stacked bar per cell (server, case) of where its mean time to first token went
    (servermetrics.TTFT_SUMMED, means over repeats), the client's mean TTFT a black tick."""
    parts = [f"ttft_{p}_ms" for p in servermetrics.TTFT_SUMMED]
    keys = [k for k in ("server_id", "client_id") if k in results.columns]
    have = [c for c in (*parts, "ttft_mean_ms") if c in results.columns]
    data = results.groupby(keys, sort=False)[have].mean().reset_index() if keys else results
    rows = data.dropna(subset=[c for c in parts if c in data.columns], how="all")
    fig = Figure(figsize=(9.0, 1.6 + 0.45 * max(1, len(rows))), layout="constrained")
    ax = fig.subplots()
    title = "Where the time to first token went (server /metrics, mean per cell)"
    fig.suptitle(title + _sim_title(labels.engine_of(results)), fontsize=11)
    if rows.empty or not set(parts) <= set(rows.columns):
        _message(ax, "no TTFT breakdown: the servers exported no per-stage latencies")
        return fig
    names = [" / ".join(str(r[k]) for k in keys) for _, r in rows.iterrows()]
    left = np.zeros(len(rows))
    for part in parts:
        width = rows[part].fillna(0.0).to_numpy(float)
        ax.barh(names, width, left=left, label=part.removeprefix("ttft_").removesuffix("_ms"))
        left += width
    if "ttft_mean_ms" in rows.columns:
        ax.scatter(rows["ttft_mean_ms"], names, marker="|", s=300, color="black",
                   label="client's mean TTFT", zorder=3)  # fmt: skip
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


SERIES_PANELS_MAX = 48


def plot_server_series(paths: Sequence[Path], *, results: pd.DataFrame) -> Figure:
    """A panel per cell (its first repeat's series file, at most SERIES_PANELS_MAX): running
    and queued requests, and KV usage on a second axis, over the client's measured window."""
    first: dict[Path, Path] = {}
    for path in paths:  # metrics/<server>/<client>/r<k>.jsonl.gz
        first.setdefault(path.parent, path)
    shown = list(first.values())[:SERIES_PANELS_MAX]
    ncols = min(4, max(1, len(shown)))
    nrows = max(1, -(-len(shown) // ncols))
    width = max(7.0, 3.6 * ncols)
    fig = Figure(figsize=(width, 2.4 * nrows + 1.2), layout="constrained")
    grid = fig.subplots(nrows, ncols, squeeze=False)
    more = f" (the first {len(shown)} of {len(first)} cells)" if len(first) > len(shown) else ""
    title = "The servers over each cell's measured window (/metrics)" + more
    title += _sim_title(labels.engine_of(results))
    fig.suptitle(_fit(title, width_in=width - 0.3, fontsize=11), fontsize=11)
    for ax in grid.flat[len(shown) :]:
        ax.set_axis_off()
    for ax, path in zip(grid.flat, shown, strict=False):
        window, series = servermetrics.window_series(path)
        cell = f"{path.parent.parent.name} / {path.parent.name}"
        ax.set_title(_fit(cell, width_in=width / ncols - 1.0, fontsize=8), fontsize=8)
        if window is None or not any(series.values()):
            _message(ax, "no /metrics reads in the window")
            continue
        for name, style in (("running_reqs", "-"), ("queue_reqs", "--")):
            points = series[name]
            ax.plot([t - window[0] for t, _ in points], [v for _, v in points], style,
                    label=name.removesuffix("_reqs"))  # fmt: skip
        ax.set_xlabel("s into the window", fontsize=8)
        ax.set_ylabel("requests", fontsize=8)
        kv = ax.twinx()
        points = series["kv_usage"]
        kv.plot([t - window[0] for t, _ in points], [100 * v for _, v in points], ":",
                color="tab:red", label="KV usage")  # fmt: skip
        kv.set_ylabel("KV usage [%]", fontsize=8)
        kv.set_ylim(bottom=0)
        ax.set_ylim(bottom=0)
        if ax is grid.flat[0]:
            handles = ax.get_legend_handles_labels()
            extra = kv.get_legend_handles_labels()
            ax.legend(handles[0] + extra[0], handles[1] + extra[1], fontsize=7)
    return fig


# A character's width as a share of the font size (DejaVu Sans, capitals included, rounded
# up): how many characters a line of a title may hold.
CHAR_EM = 0.65


def _fit(text: str, *, width_in: float, fontsize: float) -> str:
    """`text` wrapped (at its own line breaks too) to lines that fit `width_in` inches."""
    chars = max(20, int(width_in * 72 / (CHAR_EM * fontsize)))
    return "\n".join(textwrap.fill(line, chars) for line in text.splitlines())


def save_figure(fig: Figure, path: str | Path) -> None:
    """Write a figure as PNG atomically."""
    with atomic_open(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=DPI)
    log.info("wrote %s", path)


def series_axes(
    server_axes: Sequence[str], baseline: Mapping[str, Any]
) -> tuple[str | None, str | None]:
    """(hue, col) of the metric-vs plots: colour by the baseline's axis, a panel per other axis."""
    hue = next(iter(baseline), server_axes[0] if server_axes else None)
    col = next((a for a in server_axes if a != hue), None)
    return hue, col


def write_run_plots(
    *,
    summary: Mapping[str, Any],
    results: pd.DataFrame,
    deltas: Mapping[str, str | Path],
    metric_vs: Mapping[str, str | Path],
    x: str | None,
    hue: str | None,
    col: str | None,
    energy: str | Path | None = None,
    ttft: str | Path | None = None,
) -> None:
    """Every figure of a run in one process (seaborn is imported once): a delta plot per
    metric in `deltas` and, against client axis `x`, a metric-vs plot per metric in `metric_vs`
    and the energy and goodput page (`energy`)."""
    engine = labels.engine_of(results)
    for metric, path in deltas.items():
        save_figure(plot_deltas(summary, metric=metric, engine=engine), path)
    for metric, path in metric_vs.items():
        assert x is not None, "metric-vs plots need a client axis"
        save_figure(plot_metric_vs(results, metric=metric, x=x, hue=hue, col=col), path)
    if energy is not None:
        assert x is not None, "the energy page needs a client axis"
        save_figure(plot_energy_goodput(results, x=x, hue=hue, col=col), energy)
    if ttft is not None:
        save_figure(plot_ttft_breakdown(results), ttft)
