"""Per-cell figures beyond the record: tail percentiles, energy and per-GPU efficiency, goodput."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from servesweep.analysis.stats import RequestDetails
from servesweep.config.schema import SloConfig

# Tail percentiles from the per-request details: figure -> percentiles (numpy's linear one,
# as bench_serving uses). Columns `<figure>_p<q>_ms` with `.` as `_` (p99.9 -> p99_9).
TAIL_PERCENTILES: dict[str, tuple[float, ...]] = {
    "ttft": (90.0, 95.0, 99.0, 99.9),
    "tpot": (90.0, 95.0, 99.0, 99.9),
    "itl": (90.0, 95.0, 99.0, 99.9),
    "e2e": (90.0, 95.0, 99.0, 99.9),
}


def tail_column(figure: str, q: float) -> str:
    """`ttft`, 99.9 -> `ttft_p99_9_ms`."""
    return f"{figure}_p{q:g}_ms".replace(".", "_")


TAIL_COLUMNS = tuple(tail_column(f, q) for f, qs in TAIL_PERCENTILES.items() for q in qs)
EFFICIENCY_COLUMNS = (
    "joules_per_output_token",
    "joules_per_input_token",
    "output_tokens_per_watt",
    "input_tps_per_gpu",
    "output_tps_per_gpu",
    "interactivity_tps",
)
GOODPUT_COLUMNS = (
    "goodput_rps",
    "goodput_tps",
    "slo_ttft_pct",
    "slo_tpot_pct",
    "slo_e2e_pct",
    "slo_pct",
)


# loadgen.selfcheck.saturated against the config: the builtin's self-check, else the client
# process's CPU% from outside (results.DERIVED's loadgen.usage columns)
CLIENT_COLUMNS = ("client_saturated",)


def tail_figures(details: RequestDetails | None) -> dict[str, float]:
    """TAIL_COLUMNS of one cell-repeat; NaN without details or without a defined value."""
    out = dict.fromkeys(TAIL_COLUMNS, math.nan)
    if details is None:
        return out
    for figure, qs in TAIL_PERCENTILES.items():
        values = getattr(details, figure)
        values = np.sort(values[np.isfinite(values)])
        if values.size:
            for q in qs:
                out[tail_column(figure, q)] = _percentile_of_sorted(values, q)
    return out


def _percentile_of_sorted(values: np.ndarray, q: float) -> float:
    """np.percentile(values, q) (its default, linear method, and its interpolation formula)
    of sorted values: without np.percentile's per-call overhead, which dominated a 10k-record
    results.csv (two calls per record)."""
    h = (values.size - 1) * (q / 100)
    lo = math.floor(h)
    a, b = float(values[lo]), float(values[min(lo + 1, values.size - 1)])
    t = h - lo
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


def _ratio(num: float, den: float) -> float:
    return num / den if den and not math.isnan(num) and not math.isnan(den) else math.nan


def efficiency_figures(
    *,
    metrics: Mapping[str, Any],
    gpu: Mapping[str, Any],
    prefill_gpus: int,
    decode_gpus: int,
) -> dict[str, float]:
    """EFFICIENCY_COLUMNS: energy per token and tokens per watt from the sampled energy and mean
    power (NaN without samples), tok/s per GPU that did the work (input per prefill GPU and
    output per decode GPU; both the server's GPUs without PD), interactivity 1000/TPOT p50
    (tok/s seen by one user; NaN where TPOT is undefined)."""
    energy = float(gpu.get("gpu_energy_j", math.nan))
    power = float(gpu.get("gpu_power_mean_w", math.nan))
    tpot = float(metrics.get("tpot_p50_ms", math.nan))
    return {
        "joules_per_output_token": _ratio(energy, float(metrics["total_output_tokens"])),
        "joules_per_input_token": _ratio(energy, float(metrics["total_input_tokens"])),
        "output_tokens_per_watt": _ratio(float(metrics["output_tps"]), power),
        "input_tps_per_gpu": _ratio(float(metrics["input_tps"]), prefill_gpus),
        "output_tps_per_gpu": _ratio(float(metrics["output_tps"]), decode_gpus),
        "interactivity_tps": 1000.0 / tpot if tpot > 0 else math.nan,
    }


def goodput_figures(
    details: RequestDetails | None, *, slo: SloConfig, duration_s: float
) -> dict[str, float]:
    """GOODPUT_COLUMNS: requests meeting every configured SLO per second (and their output
    tok/s), and the % of all requests sent that meet each SLO and all of them.

    A failed request meets none; TPOT (one-token output) is undefined and met. An SLO not
    configured gives NaN for its %; with no SLO at all every column is NaN."""
    out = dict.fromkeys(GOODPUT_COLUMNS, math.nan)
    limits = {"ttft": slo.ttft_ms, "tpot": slo.tpot_ms, "e2e": slo.e2e_ms}
    if details is None or all(v is None for v in limits.values()) or not details.ok.size:
        return out
    good = details.ok.copy()
    for figure, limit in limits.items():
        if limit is None:
            continue
        values = getattr(details, figure)
        met = details.ok & ((values <= limit) | (np.isnan(values) & (figure == "tpot")))
        out[f"slo_{figure}_pct"] = 100.0 * float(met.mean())
        good &= met
    out["slo_pct"] = 100.0 * float(good.mean())
    out["goodput_rps"] = _ratio(float(good.sum()), duration_s)
    out["goodput_tps"] = _ratio(float(details.output_lens[good].sum()), duration_s)
    return out
