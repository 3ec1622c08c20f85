"""What a results.csv column is, in words and its unit, for axes, titles and tables."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# Column -> label (unit in brackets) where the generic rule below reads badly.
LABELS: dict[str, str] = {
    "input_tps": "input throughput [tok/s]",
    "output_tps": "output throughput [tok/s]",
    "request_throughput_rps": "request throughput [req/s]",
    "output_tps_peak": "output throughput, 1-s peak [tok/s]",
    "input_tps_per_gpu": "input throughput per GPU [tok/s]",
    "output_tps_per_gpu": "output throughput per GPU [tok/s]",
    "interactivity_tps": "interactivity, 1000 / TPOT p50 [tok/s]",
    "concurrency_mean": "achieved concurrency, mean [requests]",
    "concurrency_peak": "requests in flight in the busiest 1-s bucket [requests]",
    "concurrency": "client concurrency [requests]",
    "goodput_rps": "goodput [req/s]",
    "goodput_tps": "goodput [tok/s]",
    "slo_pct": "requests meeting every SLO [%]",
    "gpu_power_mean_w": "GPU power, mean [W]",
    "gpu_power_peak_w": "GPU power, peak [W]",
    "gpu_energy_j": "GPU energy [J]",
    "joules_per_output_token": "energy per output token [J/tok]",
    "joules_per_input_token": "energy per input token [J/tok]",
    "output_tokens_per_watt": "output tokens per watt [tok/s/W]",
    "duration_s": "client run time [s]",
    "client_process_wall_s": "client process wall time [s]",
    "client_process_cpu_s": "client process CPU time [s]",
    "client_process_cpu_pct": "client process CPU, % of one core [%]",
    "input_len": "input length [tokens]",
    "output_len": "output length [tokens]",
    "chunked_prefill_size": "chunked prefill size [tokens]",
    "request_rate": "request rate [req/s]",
}
_FIGURES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E latency"}
_PERCENTILE = re.compile(r"^(ttft|tpot|itl|e2e)_(p\d+(?:_\d+)?|mean)_ms$")
# Suffix -> unit, longest first.
_UNITS = (("_ms", "ms"), ("_rps", "req/s"), ("_tps", "tok/s"), ("_pct", "%"), ("_mib", "MiB"),
          ("_w", "W"), ("_j", "J"), ("_s", "s"))  # fmt: skip


def unit(column: str) -> str:
    """The unit of a column ('' when it has none)."""
    if column in LABELS and LABELS[column].endswith("]"):
        return LABELS[column].rsplit("[", 1)[1][:-1]
    return next((u for suffix, u in _UNITS if column.endswith(suffix)), "")


def label(column: str) -> str:
    """`ttft_p99_9_ms` -> `TTFT p99.9 [ms]`, `input_tps` -> `input throughput [tok/s]`;
    another column: its words, and its unit where the name gives one."""
    if column in LABELS:
        return LABELS[column]
    match = _PERCENTILE.match(column)
    if match:
        figure, stat = match.groups()
        return f"{_FIGURES[figure]} {stat.replace('_', '.')} [ms]"
    u = unit(column)
    words = column.removesuffix(next((s for s, x in _UNITS if column.endswith(s)), ""))
    return words.replace("_", " ") + (f" [{u}]" if u else "")


def value_text(value: float | None, column: str) -> str:
    """A figure with its unit for tables and plot notes: 3 significant digits at least; `N/A`
    where there is none (TPOT of a non-streamed or one-token case), as in the case table."""
    if value is None:
        return "N/A"
    u = unit(column)
    text = f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    return f"{text} {u}".strip()


def pct(value: float | None) -> str:
    """A % figure with one decimal and its sign; a value that rounds to zero is `0.0`, never
    `-0.0` or `+0.0` (a bound printed `-0.0` beside `worse` reads as a contradiction)."""
    if value is None:
        return "n/a"
    text = f"{value:+.1f}"
    return "0.0" if text in ("+0.0", "-0.0") else text


def sim_note(engine: Mapping[str, Any]) -> str:
    """'' for a real engine; for the sim: that it is simulated, at which time scale."""
    if engine.get("kind") != "sim":
        return ""
    scale = engine.get("time_scale")
    return (
        f"SIMULATED engine (time scale {scale:g}: wall-clock times of a sim that runs "
        f"{1 / scale:.3g}x faster than simulated time)"
        if scale
        else "SIMULATED engine (time scale 0: no simulated compute)"
    )


def engine_of(results: Any) -> dict[str, Any]:
    """{kind, time_scale} of a results table (columns engine_kind, sim_time_scale); {} for an
    older one without them."""
    if "engine_kind" not in getattr(results, "columns", ()) or results.empty:
        return {}
    kind = str(results["engine_kind"].iloc[0])
    scale = results["sim_time_scale"].iloc[0] if "sim_time_scale" in results.columns else None
    import pandas as pd  # here: the Snakefile imports labels (analysis.planned) without pandas

    scale = pd.to_numeric(pd.Series([scale]), errors="coerce").iloc[0]
    return {"kind": kind, "time_scale": None if pd.isna(scale) else float(scale)}
