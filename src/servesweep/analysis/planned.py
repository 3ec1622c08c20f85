"""What the workflow plans from the config alone, without pandas or numpy (the Snakefile
imports it: a dry-run pays no analysis imports): the summary metrics, the plotted ones, the
baseline twins of the matrix's cells, the landing page's key plots, a comparison's inputs."""

from __future__ import annotations

import logging
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from servesweep.analysis import labels
from servesweep.config.experiment import Experiment
from servesweep.config.matrix import cell_repeats
from servesweep.config.paths import RunPaths
from servesweep.core.errors import ConfigError

# summary.py's logger: the twins' warnings are the summary's.
log = logging.getLogger("servesweep.analysis.summary")

# Metrics summarized per cell and compared with the baseline, and which direction is better.
SUMMARY_METRICS: dict[str, str] = {
    "ttft_p50_ms": "lower",
    "ttft_p95_ms": "lower",
    "ttft_p99_ms": "lower",
    "e2e_p50_ms": "lower",
    "input_tps": "higher",
    "tpot_p50_ms": "lower",  # only for cells whose requests produced more than one token
    "ttft_p99_9_ms": "lower",
    "e2e_p99_ms": "lower",
    "tpot_p99_ms": "lower",
    "itl_p99_ms": "lower",
    "output_tps_peak": "higher",
    "concurrency_mean": "higher",  # achieved (Little's law) under the same client cap
    "input_tps_per_gpu": "higher",
    "output_tps_per_gpu": "higher",
    "interactivity_tps": "higher",
    "gpu_energy_j": "lower",
    "gpu_power_mean_w": "lower",
    "joules_per_output_token": "lower",
    "joules_per_input_token": "lower",
    "output_tokens_per_watt": "higher",
    "goodput_rps": "higher",
    "goodput_tps": "higher",
    "slo_pct": "higher",
    # The server's side (measure/servermetrics.py): a fuller batch, a shorter queue; for PD
    # the parts of the time to first token
    "server_running_reqs_mean": "higher",
    "server_queue_reqs_mean": "lower",
    "ttft_bootstrap_ms": "lower",
    "ttft_prefill_ms": "lower",
    "ttft_transfer_ms": "lower",
    "ttft_first_decode_ms": "lower",
}


def plot_metrics(exp: Experiment) -> list[str]:
    """The run's plotted metrics (config `plots.metrics`), each a summary metric."""
    for metric in exp.plots.metrics:
        if metric not in SUMMARY_METRICS:
            raise ConfigError(
                f"config key 'plots.metrics': {metric!r} is not a summary metric "
                f"(one of {', '.join(SUMMARY_METRICS)})"
            )
    return list(exp.plots.metrics)


def _plain(value: Any) -> Any:
    """A Python scalar: numpy types unwrapped, None/NA/NaN -> None (summary._py; numpy and
    pandas only where the caller already imported them, as no value can be theirs otherwise)."""
    pd = sys.modules.get("pandas")
    if value is None or (pd is not None and value is pd.NA):
        return None
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _key(value: Any) -> str:
    """Comparable form of an axis value: 8192, 8192.0 and "8192" are the same cell."""
    value = _plain(value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def cell_label(axes: Mapping[str, Any]) -> str:
    """`moe_runner_backend=flashinfer_mxfp4, chunked_prefill_size=8192, concurrency=8`."""
    return ", ".join(f"{k}={_key(v)}" for k, v in axes.items()) or "default"


def expected_delta_note(exp: Experiment) -> str | None:
    """Why a run of `exp` will have no deltas vs its baseline (summary.json's `note` once it
    ran), None when its matrix has candidate cells with baseline twins."""
    cells = {(c.server.id, c.client.id): {**c.server.axes, **c.client.axes}
             for c in cell_repeats(exp)}  # fmt: skip
    return _twins(list(cells.values()), exp.baseline, warn=False)[1]


def _twins(
    groups: Sequence[Mapping[str, Any]], baseline: Mapping[str, Any], *, warn: bool = True
) -> tuple[dict[int, int], str | None]:
    """Candidate cell index -> its baseline twin's index (cells given by their axes), and a
    note when there are none; `warn`: log each candidate without a twin."""
    if not baseline:
        return {}, "no baseline in this run (none configured, or narrowed out of the matrix)"
    if not groups:
        return {}, "no results in this run"
    (axis, value), *_ = baseline.items()
    axes_known = list(groups[0])
    if axis not in axes_known:
        return {}, f"baseline axis {axis} is not an axis of this run"
    want = _key(value)
    others = [a for a in axes_known if a != axis]
    index = {
        tuple(_key(ax[a]) for a in others): i
        for i, ax in enumerate(groups)
        if _key(ax[axis]) == want
    }
    if not index:
        return {}, f"baseline {axis}={want} has no results in this run"
    twins = {}
    for i, ax in enumerate(groups):
        if _key(ax[axis]) == want:
            continue
        twin = index.get(tuple(_key(ax[a]) for a in others))
        if twin is None:
            if not warn:
                continue
            log.warning("cell %s has no baseline twin with %s=%s", cell_label(ax), axis, want)
            continue
        twins[i] = twin
    if not twins:
        return {}, f"only the baseline {axis}={want} ran: no other value to compare"
    return twins, None


def key_plots(
    *, deltas: Mapping[str, str], metric_vs: Mapping[str, str], x: str | None
) -> dict[str, str]:
    """caption -> PNG of the plots the page shows: the delta plots (else the metric-vs
    plots) of the first latency and the first throughput among the plotted metrics."""
    plots, what = (deltas, "change vs baseline") if deltas else (metric_vs, f"against {x}")
    picked: list[str] = []
    for direction in ("lower", "higher"):
        picked += [m for m in plots if SUMMARY_METRICS.get(m) == direction][:1]
    picked += [m for m in plots if m not in picked][: max(0, 2 - len(picked))]
    return {f"{labels.label(m)}: {what}": plots[m] for m in picked}


def run_inputs(*, run_dir: str | Path, current: bool = False) -> dict[str, Any]:
    """The files a comparison reads from one run: results.csv, requests.csv and the
    equivalence probe's answers.

    requests.csv is listed for the run of the current config (the workflow makes it) and for
    any other run that has one (without it a run's cells are resampled at the repeat level);
    the answers that exist now (equivalence/<server>.json).
    """
    paths = RunPaths(Path(run_dir))
    found = current or paths.requests_csv.exists()
    return {
        "csv": str(paths.results_csv),
        "requests": [str(paths.requests_csv)] if found else [],
        "probes": sorted(str(p) for p in (paths.root / "equivalence").glob("*.json")),
    }
