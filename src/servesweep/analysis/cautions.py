"""What a reader must know before trusting a run's numbers: each fact defined once, shown by the
console's answer block (analysis.answer) and the report's first page (analysis.landing)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from servesweep.analysis.equivalence import differing
from servesweep.measure.validation import DRIFT_WARNING_RATIO

# Failed cell attempts listed one by one; more are counted.
MAX_FAILED = 10
# Saturated cells named in the line; more are elided.
MAX_NAMED = 3
# The log-scan warnings the simulated engine writes on purpose, as healthy real SGLang does
# (engine.sim.noise, servesweep.sim.node.startup_noise and the Mooncake E line of
# servesweep.sim.mooncake): on a sim run they are its noise, not warnings.
SIM_NOISE = ("moe_default_config", "user_warning", "nccl_warn", "native_error")


def _sim_run(summary: Mapping[str, Any]) -> bool:
    return (summary.get("engine") or {}).get("kind") == "sim"


def sim_noise(summary: Mapping[str, Any]) -> str | None:
    """The sim's deliberate log noise of a sim run, in one sentence (None where there is
    none): shown beside the warnings, never among them."""
    scan = (summary.get("log_scan") or {}).get("warnings") or {}
    found = {n: c for n, c in sorted(scan.items()) if n in SIM_NOISE} if _sim_run(summary) else {}
    if not found:
        return None
    counts = ", ".join(f"{name} x {count}" for name, count in found.items())
    return (
        f"Not warnings: the simulated engine's deliberate log noise ({counts} in logscan.json), "
        "written as healthy real SGLang writes it (engine.sim.noise: false turns it off)."
    )


def cautions(
    *,
    summary: Mapping[str, Any],
    results: pd.DataFrame,
    events: Sequence[tuple[str, str, Mapping[str, str]]],
) -> list[str]:
    """One sentence per caution: fatal and warning server-log findings (but a sim's deliberate
    noise: sim_noise), re-tokenization drift, invalid (failed) cell attempts not remeasured
    since, client-saturated cells, streamed cells with a TPOT of 0, node clocks off the
    workflow host's (GPU samples aligned), coarse intervals."""
    out = [
        f"WARNING: outputs differ: {_axes(c.get('candidate_axes'))} answers otherwise than its "
        f"baseline {_axes(c.get('baseline_axes'))} "
        f"({c.get('first_token_agree')}/{c.get('prompts')} first tokens agree, greedy prefix "
        f"min {c.get('prefix_min')} of {c.get('output_len')}"
        f"{'; ' + str(c['why']) if c.get('why') else ''}): whatever its speed, it is not better "
        "(equivalence.json; docs/equivalence.md)."
        for c in differing(summary.get("equivalence"))
    ]
    scan = summary.get("log_scan") or {}
    if scan.get("fatal_findings"):
        out.append(f"Server logs: {scan['fatal_findings']} fatal finding(s) (logscan.json).")
    for name, count in sorted((scan.get("warnings") or {}).items()):
        if _sim_run(summary) and name in SIM_NOISE:
            continue  # sim_noise says so
        out.append(f"Server logs: warning {name} x {count} (logscan.json).")
    if "retokenized_ratio" in results.columns:
        ratio = pd.to_numeric(results["retokenized_ratio"], errors="coerce")
        drift = ratio[ratio < DRIFT_WARNING_RATIO]  # the record check's warning (validation)
        if len(drift):
            out.append(
                f"Re-tokenization drift in {len(drift)} of {len(results)} cell-repeats: "
                f"re-tokenized output / output tokens from {drift.min():.4f} to "
                f"{drift.max():.4f} (retokenized_ratio in results.csv; docs/validation.md)."
            )
    failed = current_failures(events)
    for fields in failed[:MAX_FAILED]:
        out.append(
            f"Invalid cell attempt {fields.get('cell', '?')}: {fields.get('error', '?')} "
            "(orchestrator.log; not in results.csv)."
        )
    if len(failed) > MAX_FAILED:
        out.append(f"... and {len(failed) - MAX_FAILED} more invalid cell attempts.")
    flagged = _flagged(results, "client_saturated")
    if len(flagged):
        out.append(
            f"Client saturated in {len(flagged)} of {len(results)} cell-repeats"
            f"{_named(flagged)}: the load generator, not the server, may have set the pace "
            "(client_saturated in results.csv)."
        )
    zero = _flagged(results, "tpot_zero")
    if len(zero):
        out.append(
            f"TPOT p50 of 0.00 ms in {len(zero)} of {len(results)} cell-repeats{_named(zero)} "
            "that stream outputs of more than one token: a measurement error (the tokens "
            "arrived at once, e.g. through a buffering router), not a decode speed (tpot_zero "
            "in results.csv)."
        )
    if "gpu_clock_skewed" in results.columns:
        skewed = results[results["gpu_clock_skewed"].astype(str) == "True"]
        if len(skewed):
            worst = pd.to_numeric(skewed["gpu_clock_offset_s"], errors="coerce").abs().max()
            out.append(
                f"GPU clocks: in {len(skewed)} of {len(results)} cell-repeats a node's clock was "
                f"off the workflow host's by more than the sampling interval (up to {worst:.3f} "
                "s); its samples were aligned by the offset measured in the cell "
                "(gpu_clock_offset_s in results.csv)."
            )
    if any(d.get("coarse") for d in summary.get("deltas") or []):
        out.append("Few repeats per cell: intervals are coarse (see the method).")
    return out


def current_failures(
    events: Sequence[tuple[str, str, Mapping[str, str]]],
) -> list[Mapping[str, str]]:
    """The `cell-failed` events of orchestrator.log whose cell has no `cell-done` after them:
    an invalid attempt that a valid record of the same cell-repeat replaced is history (the
    log keeps it), no caution about the numbers."""
    done = {f.get("cell"): i for i, (_, kind, f) in enumerate(events) if kind == "cell-done"}
    return [
        fields
        for i, (_, kind, fields) in enumerate(events)
        if kind == "cell-failed" and done.get(fields.get("cell"), -1) < i
    ]


def _flagged(results: pd.DataFrame, column: str) -> pd.DataFrame:
    """The rows whose boolean `column` is True (none where results.csv lacks it)."""
    if column not in results.columns:
        return results.iloc[:0]
    return results[results[column].astype(str) == "True"]


def _named(rows: pd.DataFrame) -> str:
    """` (server/client, ...)`: the cells of `rows`, the first MAX_NAMED of them."""
    if not {"server_id", "client_id"} <= set(rows.columns):
        return ""
    cells = sorted({f"{r.server_id}/{r.client_id}" for r in rows.itertuples()})
    named = ", ".join(cells[:MAX_NAMED]) + (" ..." if len(cells) > MAX_NAMED else "")
    return f" ({named})" if named else ""


def _axes(axes: Mapping[str, Any] | None) -> str:
    return ", ".join(f"{k}={v}" for k, v in (axes or {}).items()) or "?"
