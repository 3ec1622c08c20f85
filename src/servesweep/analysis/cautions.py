"""What a reader must know before trusting a run's numbers: each fact defined once, shown by the
console's answer block (analysis.answer) and the report's first page (analysis.landing)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from servesweep.measure.validation import DRIFT_WARNING_RATIO

# Failed cell attempts listed one by one; more are counted.
MAX_FAILED = 10
# Saturated cells named in the line; more are elided.
MAX_NAMED = 3


def cautions(
    *,
    summary: Mapping[str, Any],
    results: pd.DataFrame,
    events: Sequence[tuple[str, str, Mapping[str, str]]],
) -> list[str]:
    """One sentence per caution: fatal and warning server-log findings, re-tokenization drift,
    invalid (failed) cell attempts, client-saturated cells, node clocks off the workflow host's
    (GPU samples aligned), coarse intervals."""
    out = []
    scan = summary.get("log_scan") or {}
    if scan.get("fatal_findings"):
        out.append(f"Server logs: {scan['fatal_findings']} fatal finding(s) (logscan.json).")
    for name, count in sorted((scan.get("warnings") or {}).items()):
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
    failed = [f for _, kind, f in events if kind == "cell-failed"]
    for fields in failed[:MAX_FAILED]:
        out.append(
            f"Invalid cell attempt {fields.get('cell', '?')}: {fields.get('error', '?')} "
            "(orchestrator.log; not in results.csv)."
        )
    if len(failed) > MAX_FAILED:
        out.append(f"... and {len(failed) - MAX_FAILED} more invalid cell attempts.")
    if "client_saturated" in results.columns and len(results):
        flagged = results[results["client_saturated"].astype(str) == "True"]
        if len(flagged):
            cells = sorted(
                {f"{r.server_id}/{r.client_id}" for r in flagged.itertuples()}
                if {"server_id", "client_id"} <= set(results.columns)
                else set()
            )
            named = ", ".join(cells[:MAX_NAMED]) + (" ..." if len(cells) > MAX_NAMED else "")
            named = f" ({named})" if named else ""
            out.append(
                f"Client saturated in {len(flagged)} of {len(results)} cell-repeats{named}: "
                "the load generator, not the server, may have set the pace (client_saturated "
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
