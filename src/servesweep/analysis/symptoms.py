"""Run-level symptoms read from results.csv, each with what to do about it.

Seed 003's fixed-delay symptom (sglang#34815, PD with PP8 prefill): every request waits about
the same time before its first token, whatever its prompt, so TTFT has a floor that does not
move with the work. Seed 003's healthy table has 1.2 s for 64 tokens against 7.6 s for 16K
at concurrency 1 (a share of 0.16); a run whose smallest prompt waits at least FLOOR_SHARE of
its largest prompt's TTFT is flagged, and `config/experiments/pd_pp1_control.yaml` (PP1
prefill) is the control the seed names."""

from __future__ import annotations

from typing import Any

import pandas as pd

FLOOR_SHARE = 0.7
MIN_INPUT_RATIO = 16.0  # prompts this many times longer must take visibly longer
ONE_AT_A_TIME = 1.5  # achieved concurrency of a concurrency-1 case (Little's law)
CONTROL = "config/experiments/pd_pp1_control.yaml"


def fixed_delay(results: pd.DataFrame, *, case_axis: str = "case") -> dict[str, Any] | None:
    """The fixed-delay check over the run's one-at-a-time cases (None when the run has no
    cases, or no two of them with prompts MIN_INPUT_RATIO apart)."""
    needed = {case_axis, "ttft_p50_ms", "total_input_tokens", "completed", "concurrency_mean"}
    if not needed <= set(results.columns) or results.empty:
        return None
    rows = results[results["concurrency_mean"] <= ONE_AT_A_TIME].copy()
    rows = rows[rows["completed"] > 0]
    if rows.empty:
        return None
    rows["input_len"] = rows["total_input_tokens"] / rows["completed"]
    cases = rows.groupby(case_axis).agg(
        ttft_ms=("ttft_p50_ms", "median"), input=("input_len", "median")
    )
    cases = cases.dropna()
    if len(cases) < 2:
        return None
    small, large = cases["input"].idxmin(), cases["input"].idxmax()
    if cases.loc[large, "input"] < MIN_INPUT_RATIO * cases.loc[small, "input"]:
        return None
    floor = float(cases.loc[small, "ttft_ms"])
    share = floor / float(cases.loc[large, "ttft_ms"])
    suspected = share >= FLOOR_SHARE
    at_floor = [
        str(name)
        for name, row in cases.iterrows()
        if row["input"] >= MIN_INPUT_RATIO * cases.loc[small, "input"]
        and row["ttft_ms"] <= floor / FLOOR_SHARE
    ]
    out: dict[str, Any] = {
        "suspected": bool(suspected),
        "smallest_case": str(small),
        "smallest_ttft_p50_ms": round(floor, 3),
        "largest_case": str(large),
        "largest_ttft_p50_ms": round(float(cases.loc[large, "ttft_ms"]), 3),
        "share": round(share, 3),
        "limit": FLOOR_SHARE,
        "cases_at_floor": at_floor if suspected else [],
    }
    if suspected:
        out["advice"] = (
            f"TTFT of {small} is {share:.0%} of {large}'s although its prompt is "
            f"{cases.loc[large, 'input'] / cases.loc[small, 'input']:.0f}x shorter: the "
            f"fixed-delay symptom (sglang#34815); run {CONTROL} (PP1 prefill) as the control"
        )
    return out
