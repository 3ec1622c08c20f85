"""A cell's GPU figures from its GPU file (results.csv columns): the before/after snapshot figures
and, from the loop samples over the client's measured window, energy, mean and peak power."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from servesweep.core.gpufile import (
    PHASE_CLOCK,
    PHASE_SAMPLE,
    PHASE_WINDOW_END,
    PHASE_WINDOW_START,
    PHASES,
    STATUS_CLOCK_UNMEASURED,
    STATUS_INCOMPLETE,
    STATUS_OK,
    STATUS_PARTIAL,
    STATUS_SIMULATED,
    STATUS_UNAVAILABLE,
    number_of,
    parse_timestamp,
    text_of,
)

# Figures of the before/after snapshots.
GPU_FIGURES = (
    "gpu_count",
    "gpu_mem_used_peak_mib",
    "gpu_power_peak_w",
    "gpu_util_mean_pct",
    "gpu_status",
)
# Sample figures that depend on where the samples fall against the measured window.
WINDOW_FIGURES = (
    "gpu_energy_j",
    "gpu_power_mean_w",
    "gpu_power_peak_w",
    "gpu_mem_used_peak_mib",
    "gpu_util_mean_pct",
    "gpu_samples",
    "gpu_node_power_w",
)
# Figures from the samples over the measured window (results.csv columns).
SAMPLE_FIGURES = (*WINDOW_FIGURES, "gpu_source", "gpu_clock_offset_s", "gpu_clock_skewed")
# The roles of the cell's server set whose processes share a GPU (`prefill+decode`, from
# cluster.gpu_ids; empty: none). A cell reads a shared GPU once, under its first node
# (measure.cells.gpu_nodes): its figures count once and cannot be split between the roles.
SHARED_COLUMN = "gpu_shared_by"
# gpu_source values in results.csv.
SOURCE_MEASURED = "measured"
SOURCE_SIMULATED = "simulated"
SOURCE_PARTIAL = "partial"
SOURCE_UNAVAILABLE = "unavailable"


def _values(rows: Iterable[Mapping[str, Any]], column: str) -> list[float]:
    """The values of a numeric column that are present (missing ones left out)."""
    values = (number_of(r.get(column)) for r in rows)
    return [v for v in values if not math.isnan(v)]


def _paired_snapshot_figures(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """snapshot_figures of a cell's whole snapshot (before + after rows); `incomplete` (never `ok`)
    when a node's before and after rows do not pair up (a file cut short)."""
    figures = snapshot_figures(rows)
    if not _paired(rows):
        figures["gpu_status"] = STATUS_INCOMPLETE
    return figures


def _paired(rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether every node has as many rows after the client as before it (and some)."""
    counts: dict[tuple[str, str], int] = {}
    for r in rows:
        if text_of(r.get("phase")) not in PHASES:
            continue  # loop samples and the measured window
        key = (text_of(r.get("node")), text_of(r.get("phase")))
        counts[key] = counts.get(key, 0) + 1
    nodes = {node for node, _ in counts}
    return all(counts.get((n, "before"), 0) == counts.get((n, "after"), 0) > 0 for n in nodes)


def snapshot_figures(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-cell GPU figures for results.csv; NaN (never guessed) where no GPU was read.

    `rows` are snapshot rows (read_snapshot, node_rows; a frame's `.to_dict("records")`).
    `gpu_status` is `ok` when every node answered, `unavailable` when none did, and `partial`
    when some did (figures then cover the GPUs that answered).
    """
    snapshot = [r for r in rows if text_of(r.get("phase")) in PHASES]  # not loop samples
    ok = [r for r in snapshot if text_of(r.get("status")) == STATUS_OK]
    if not ok:
        return {
            "gpu_count": math.nan,
            "gpu_mem_used_peak_mib": math.nan,
            "gpu_power_peak_w": math.nan,
            "gpu_util_mean_pct": math.nan,
            "gpu_status": STATUS_UNAVAILABLE,
        }
    memory = _values(ok, "memory_used_mib")
    power = _values(ok, "power_draw_w")
    util = _values((r for r in ok if text_of(r.get("phase")) == "after"), "utilization_gpu_pct")
    return {
        "gpu_count": len({(text_of(r.get("node")), number_of(r.get("index"))) for r in ok}),
        "gpu_mem_used_peak_mib": max(memory) if memory else math.nan,
        "gpu_power_peak_w": max(power) if power else math.nan,
        "gpu_util_mean_pct": math.fsum(util) / len(util) if util else math.nan,
        "gpu_status": STATUS_OK if len(ok) == len(snapshot) else STATUS_PARTIAL,
    }


def measured_window(rows: Iterable[Mapping[str, Any]]) -> tuple[float, float] | None:
    """The client's measured window recorded in a GPU file, or None."""
    found = {text_of(r.get("phase")): text_of(r.get("timestamp")) for r in rows}
    if not found.get(PHASE_WINDOW_START) or not found.get(PHASE_WINDOW_END):
        return None
    return parse_timestamp(found[PHASE_WINDOW_START]), parse_timestamp(found[PHASE_WINDOW_END])


def _interp(a: tuple[float, float], b: tuple[float, float], t: float) -> float:
    (ta, va), (tb, vb) = a, b
    return va if tb == ta else va + (vb - va) * (t - ta) / (tb - ta)


def clip_series(
    points: Sequence[tuple[float, float]], window: tuple[float, float] | None
) -> list[tuple[float, float]]:
    """(time, value) points inside the window, with values linearly interpolated at each
    window edge that lies between two samples (an edge outside the samples is not invented)."""
    pts = sorted((t, v) for t, v in points if not math.isnan(v))
    if window is None:
        return pts
    t0, t1 = window
    inside = [(t, v) for t, v in pts if t0 <= t <= t1]
    before = [p for p in pts if p[0] < t0]
    after = [p for p in pts if p[0] > t1]
    if before and (inside or after) and not (inside and inside[0][0] == t0):
        nxt = inside[0] if inside else after[0]
        inside.insert(0, (t0, _interp(before[-1], nxt, t0)))
    if after and (inside or before) and not (inside and inside[-1][0] == t1):
        prev = inside[-1] if inside else before[-1]
        inside.append((t1, _interp(prev, after[0], t1)))
    return inside


def trapezoid(points: Sequence[tuple[float, float]]) -> float:
    """The integral of sorted (time, value) points by the trapezoid rule (0 for one point)."""
    return math.fsum(
        (tb - ta) * (va + vb) / 2 for (ta, va), (tb, vb) in zip(points, points[1:], strict=False)
    )


def clock_offsets(rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """node -> its clock minus the workflow host's (the GPU file's `clock` rows; none in a
    file written before cells measured it)."""
    found = {}
    for r in rows:
        offset = number_of(r.get("clock_offset_s"))
        if text_of(r.get("phase")) == PHASE_CLOCK and not math.isnan(offset):
            found[text_of(r.get("node"))] = offset
    return found


def unmeasured_clocks(rows: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """node -> why its clock could not be read, for each node whose GPUs were sampled (status
    `ok`: stamped by the node's own clock) while its `clock` row has no offset. A file without
    `clock` rows (written before cells measured them) has none."""
    rows = list(rows)
    sampled = {
        text_of(r.get("node"))
        for r in rows
        if text_of(r.get("phase")) == PHASE_SAMPLE and text_of(r.get("status")) == STATUS_OK
    }
    offsets = clock_offsets(rows)
    return {
        text_of(r.get("node")): text_of(r.get("detail")) or "no clock offset"
        for r in rows
        if text_of(r.get("phase")) == PHASE_CLOCK
        and text_of(r.get("node")) in sampled
        and text_of(r.get("node")) not in offsets
    }


def _interval(points: Sequence[tuple[float, Any]]) -> float:
    """The sampling interval of one GPU's series (median step; inf with fewer than 2)."""
    steps = sorted(b[0] - a[0] for a, b in zip(points, points[1:], strict=False))
    return steps[len(steps) // 2] if steps else math.inf


def _source(statuses: set[str]) -> str:
    good = statuses & {STATUS_OK, STATUS_SIMULATED}
    if not good:
        return SOURCE_UNAVAILABLE
    if STATUS_UNAVAILABLE in statuses:
        return SOURCE_PARTIAL
    return SOURCE_SIMULATED if STATUS_SIMULATED in statuses else SOURCE_MEASURED


def sample_figures(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Figures of the samples in a GPU file over its measured window (all samples without one).

    Per GPU: energy = trapezoid of power over the window, mean power = energy / span. Per
    node: mean = sum of its GPUs' means, peak = highest sum over one loop tick or window edge
    (interpolated, as the mean uses them). Total: sums over nodes (the peak is the sum of node
    peaks: nodes are not sampled in lockstep). Peak memory and mean SM utilisation over the
    samples in the window. NaN where no sample."""
    rows = list(rows)
    window = measured_window(rows)
    samples = [r for r in rows if text_of(r.get("phase")) == PHASE_SAMPLE]
    out: dict[str, Any] = dict.fromkeys(SAMPLE_FIGURES, math.nan)
    out["gpu_samples"] = 0
    out["gpu_source"] = _source({text_of(r.get("status")) for r in samples})
    offsets = clock_offsets(rows)
    if offsets:
        out["gpu_clock_offset_s"] = max(offsets.values(), key=abs)
    good = [r for r in samples if text_of(r.get("status")) in (STATUS_OK, STATUS_SIMULATED)]
    if not good:
        return out

    def when(r: Mapping[str, Any]) -> float:
        """A sample's time on the workflow host's clock (the window's): a node's nvidia-smi
        stamps its own time; the sim's curve is stamped on the workflow host."""
        t = parse_timestamp(text_of(r.get("timestamp")))
        measured = text_of(r.get("status")) == STATUS_OK
        return t - offsets.get(text_of(r.get("node")), 0.0) if measured else t

    series: dict[tuple[str, float], list[tuple[float, Mapping[str, Any]]]] = {}
    for r in good:
        series.setdefault((text_of(r.get("node")), number_of(r.get("index"))), []).append(
            (when(r), r)
        )
    if offsets:
        out["gpu_clock_skewed"] = any(
            abs(offsets.get(node, 0.0)) > _interval(points) for (node, _), points in series.items()
        )
    t0, t1 = window if window else (-math.inf, math.inf)
    energy, node_mean, node_peak = 0.0, {}, {}
    # Each node's summed power at the window's edges (interpolated): the mean counts them,
    # so the peak does too (else a short window's mean could exceed its peak).
    edges: dict[str, dict[float, float]] = {}
    spans_ok = True
    for (node, _), points in series.items():
        power = clip_series([(t, number_of(r.get("power_draw_w"))) for t, r in points], window)
        for t, watts in power:
            if t in (t0, t1):
                edges.setdefault(node, {}).setdefault(t, 0.0)
                edges[node][t] += watts
        if len(power) < 2 or power[-1][0] <= power[0][0]:
            spans_ok = False
            continue
        joules = trapezoid(power)
        energy += joules
        node_mean[node] = node_mean.get(node, 0.0) + joules / (power[-1][0] - power[0][0])
    in_window = [(t, r) for pts in series.values() for t, r in pts if t0 <= t <= t1]
    for node in {n for n, _ in series}:
        ticks: list[float] = []
        seen: set[float] = set()
        for r in good:  # file order: one loop tick prints every GPU once
            if text_of(r.get("node")) != node:
                continue
            index = number_of(r.get("index"))
            if index in seen or not ticks:
                ticks.append(0.0)
                seen = set()
            seen.add(index)
            if t0 <= when(r) <= t1:
                ticks[-1] += number_of(r.get("power_draw_w"))
        ticks += edges.get(node, {}).values()
        node_peak[node] = max(ticks) if ticks else math.nan
    memory = [number_of(r.get("memory_used_mib")) for _, r in in_window]
    util = [number_of(r.get("utilization_gpu_pct")) for _, r in in_window]
    memory = [m for m in memory if not math.isnan(m)]
    util = [u for u in util if not math.isnan(u)]
    out.update(
        gpu_energy_j=energy if spans_ok and node_mean else math.nan,
        gpu_power_mean_w=math.fsum(node_mean.values()) if spans_ok and node_mean else math.nan,
        gpu_power_peak_w=math.fsum(node_peak.values()) if in_window or edges else math.nan,
        gpu_mem_used_peak_mib=max(memory) if memory else math.nan,
        gpu_util_mean_pct=math.fsum(util) / len(util) if util else math.nan,
        gpu_samples=len(in_window),
        gpu_node_power_w=";".join(
            f"{n}={node_mean.get(n, math.nan):.1f}/{node_peak[n]:.1f}" for n in sorted(node_peak)
        ),
    )
    if unmeasured_clocks(rows):  # samples on an unread clock are nowhere in the window
        out.update(dict.fromkeys(WINDOW_FIGURES, math.nan))
    return out


# GPU columns of results.csv: snapshot figures, then the sampled ones (cluster.gpusampling),
# then who shares a GPU.
GPU_COLUMNS = tuple(dict.fromkeys((*GPU_FIGURES, *SAMPLE_FIGURES, SHARED_COLUMN)))


def gpu_figures(rows: Sequence[Mapping[str, Any]], *, shared_by: str = "") -> dict[str, Any]:
    """GPU_COLUMNS of one GPU file: count and status from the snapshots (`incomplete` when a
    node's before and after rows do not pair up, `clock-unmeasured` when a sampled node's
    clock could not be read: its window figures are blank); power, memory and utilisation
    from the loop samples over the measured window (the snapshots' where a file has no
    samples, e.g. one written before sampling existed). `gpu_shared_by` is `shared_by`: the
    roles that share a GPU, which the file holds once (NaN: none)."""
    snapshot = _paired_snapshot_figures(rows)
    samples = sample_figures(rows)
    # a file written before sampling existed: its snapshots give these figures
    if not any(r.get("phase") == PHASE_SAMPLE for r in rows):
        kept = ("gpu_power_peak_w", "gpu_mem_used_peak_mib", "gpu_util_mean_pct")
        samples.update({k: snapshot[k] for k in kept})
    found = {col: samples.get(col, snapshot.get(col)) for col in GPU_COLUMNS}
    found[SHARED_COLUMN] = shared_by or math.nan  # empty in results.csv: no GPU shared
    if snapshot["gpu_status"] == STATUS_INCOMPLETE:  # a cut file: its samples may be cut too
        found.update({c: math.nan for c in SAMPLE_FIGURES if c not in ("gpu_source",)})
        found["gpu_samples"] = math.nan
    # the local sim: no nvidia-smi for the snapshots, but its simulated curve gives the figures
    if found["gpu_status"] == STATUS_UNAVAILABLE and found.get("gpu_source") == SOURCE_SIMULATED:
        found["gpu_status"] = STATUS_SIMULATED
    if found["gpu_status"] != STATUS_INCOMPLETE and unmeasured_clocks(rows):
        found["gpu_status"] = STATUS_CLOCK_UNMEASURED  # sample_figures left them blank
    return found
