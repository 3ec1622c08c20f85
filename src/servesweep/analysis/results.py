"""Raw cell-repeat records and GPU snapshots to results.csv (one row per cell-repeat)."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pydantic import ValidationError

from servesweep.analysis import figures, stats
from servesweep.analysis.gpufigures import GPU_COLUMNS, gpu_figures, unmeasured_clocks
from servesweep.analysis.tablecsv import runs_csv_text
from servesweep.analysis.tables import read_requests_csv, read_results_csv  # noqa: F401
from servesweep.config.experiment import gpu_shared_by
from servesweep.config.matrix import CellRepeat
from servesweep.config.schema import (
    MIN_RETOKENIZED_RATIO,
    ClusterConfig,
    SaturationConfig,
    SloConfig,
    Workload,
)
from servesweep.core import gpufile
from servesweep.core.errors import CellFailed
from servesweep.core.files import atomic_open
from servesweep.core.parallel import map_chunks
from servesweep.measure import isolation, provenance, servermetrics, validation
from servesweep.measure.loadgen import selfcheck, usage
from servesweep.measure.records import (
    EVIDENCE_COLUMN_PREFIX,
    EVIDENCE_KEY,
    START_KEY,
    START_PHASES,
    BenchRecord,
    read_record,
)

log = logging.getLogger(__name__)
# Per-request TTFT, E2E, TPOT (ms) of one cell-repeat (stats.request_figures); None: none.
Requests = tuple[np.ndarray, np.ndarray, np.ndarray] | None

# results.csv metric column -> bench_serving record key (SGLANG.md 1.5-1.6).
METRICS: dict[str, str] = {
    "ttft_p50_ms": "median_ttft_ms",
    "ttft_p95_ms": "p95_ttft_ms",  # 0.5.14+; NaN for 0.5.9-0.5.13 records
    "ttft_p99_ms": "p99_ttft_ms",
    "ttft_mean_ms": "mean_ttft_ms",
    "e2e_p50_ms": "median_e2e_latency_ms",
    "e2e_p99_ms": "p99_e2e_latency_ms",
    "e2e_mean_ms": "mean_e2e_latency_ms",
    "tpot_p50_ms": "median_tpot_ms",
    "tpot_p95_ms": "p95_tpot_ms",  # 0.5.14+
    "itl_p50_ms": "median_itl_ms",
    "input_tps": "input_throughput",
    "output_tps": "output_throughput",
    "request_throughput_rps": "request_throughput",  # requests/s
    "duration_s": "duration",
    "completed": "completed",
    "total_input_tokens": "total_input_tokens",
    "total_output_tokens": "total_output_tokens",
    "concurrency_mean": "concurrency",  # Little's law: sum of request latencies / duration
    "concurrency_peak": "max_concurrent_requests",  # bench 0.5.14+ and builtin; else NaN
    "output_tps_peak": "max_output_tokens_per_s",  # highest 1-s bucket (bench's method)
    # the builtin client's self-check (loadgen.selfcheck); NaN for bench_serving
    "client_cpu_pct": "client_cpu_pct",
    "client_loop_lag_p99_ms": "client_loop_lag_p99_ms",
    "client_loop_lag_max_ms": "client_loop_lag_max_ms",
    "client_gc_pause_ms": "client_gc_pause_ms",
}
# Figures derived from several record keys, after the METRICS columns: the client process's
# wall and CPU time measured from outside (loadgen.usage; either client), the re-tokenized
# ratio (docs/validation.md).
DERIVED = (*usage.COLUMNS, "retokenized_ratio")
# Tail percentiles from the per-request details that the record does not hold already.
TAIL_COLUMNS = tuple(c for c in figures.TAIL_COLUMNS if c not in METRICS)
# A TPOT p50 below this prints as 0.00 ms (bench_serving's table): for streamed outputs of
# more than one token no decode speed but every token arriving at once (tpot_zero).
ZERO_TPOT_MS = 0.005
# Measurement checks of a cell-repeat: True where its figures cannot be what they say.
CHECK_COLUMNS = ("tpot_zero",)
# Per-request, energy and SLO figures (servesweep.analysis.figures), after the GPU columns.
FIGURE_COLUMNS = (
    *TAIL_COLUMNS,
    *figures.EFFICIENCY_COLUMNS,
    *figures.GOODPUT_COLUMNS,
    *figures.CLIENT_COLUMNS,
    *CHECK_COLUMNS,
)
INTEGER_METRICS = ("completed", "total_input_tokens", "total_output_tokens")
# The record's TPOT and ITL: undefined when every request made one token, or when responses
# were not streamed (each arrives whole, its TTFT is its latency); bench_serving and the
# builtin write 0.0 for both: blank, never 0.
TOKEN_TIMING = tuple(c for c in METRICS if c.startswith(("tpot_", "itl_")))
# The engine that measured a row; a sim row also carries its time scale (wall = simulated x
# scale) and its figures scaled back to simulated time (latency / scale, rate x scale).
ENGINE_COLUMNS = ("engine_kind", "sim_time_scale")
SIM_LATENCIES = ("ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "tpot_p50_ms")
SIM_RATES = ("input_tps", "output_tps", "request_throughput_rps")
SIM_COLUMNS = tuple(f"simulated_{c}" for c in (*SIM_LATENCIES, *SIM_RATES))
# The server's parallel layout, a column each even when no matrix axis varies it (EP_SIZE
# changes ep_size for a whole run): runs compared side by side say what differed.
LAYOUT_ARGS = ("tp_size", "ep_size", "dp_size", "pp_size")
# Floats in results.csv: 8 significant digits (float noise cut, deltas unchanged to 1e-6 %).
SIGNIFICANT_DIGITS = 8
# Keys every supported record version (0.5.9..0.5.23, builtin) has; absent = invalid record.
REQUIRED_KEYS = (
    "completed",
    "duration",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_e2e_latency_ms",
    "input_throughput",
    "total_input_tokens",
    "total_output_tokens",
)
# The record keys collect_results reads (records are parsed with these only): the metrics, the
# re-tokenized count and the per-request details (stats.REQUEST_KEYS).
READ_KEYS = frozenset(
    {*METRICS.values(), *REQUIRED_KEYS, "total_output_tokens_retokenized", usage.RECORD_KEY}
)
# Whether the server's radix cache was flushed before the cell (empty: not known, e.g. imported).
HYGIENE_COLUMNS = ("cache_flushed",)
# Where the start of the cell's server went (records.START_KEY): the same for every cell it
# served; NaN where the log does not show a phase (older releases print no timing summary).
START_COLUMNS = tuple(f"start_{phase}" for phase in START_PHASES)
ID_COLUMNS = ("run_id", "server_id", "client_id", "repeat", "seed", "fingerprint", "pool")

# requests.csv: one row per successful request of every cell-repeat (stats.request_figures).
REQUEST_ID_COLUMNS = ("server_id", "client_id", "repeat")
REQUEST_COLUMNS = (*REQUEST_ID_COLUMNS, "ttft_ms", "e2e_ms", "tpot_ms")


def _number(key: str, value: Any) -> float:
    if value is None:
        return math.nan
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"record key {key}: not a number: {value!r}")
    return float(value)


def _fields(record: BenchRecord | Mapping[str, Any]) -> dict[str, Any]:
    """A record's keys and values: model_dump's, without copying every per-request list."""
    if isinstance(record, BenchRecord):
        return {**record.__dict__, **(record.model_extra or {})}
    return dict(record)


def record_metrics(
    record: BenchRecord | Mapping[str, Any], *, stream: bool = True
) -> dict[str, float | int]:
    """The METRICS and DERIVED figures of one record; absent keys are NaN (older
    bench_serving versions), and so are TOKEN_TIMING of one-token outputs and, with `stream`
    False (the workload's), of every record."""
    data = _fields(record)
    out: dict[str, float | int] = {}
    for column, key in METRICS.items():
        value = _number(key, data.get(key))
        out[column] = int(value) if column in INTEGER_METRICS and value.is_integer() else value
    total, completed = out["total_output_tokens"], out["completed"]
    # NaN compares False: unknown counts keep the record's figures
    if not stream or total <= completed:
        out.update(dict.fromkeys(TOKEN_TIMING, math.nan))
    retok = _number("total_output_tokens_retokenized", data.get("total_output_tokens_retokenized"))
    total = out["total_output_tokens"]
    out.update(usage.columns(data.get(usage.RECORD_KEY)))
    out["retokenized_ratio"] = retok / total if total and not math.isnan(total) else math.nan
    return out


def engine_figures(
    metrics: Mapping[str, Any], *, engine_kind: str, time_scale: float | None
) -> dict[str, Any]:
    """ENGINE_COLUMNS and SIM_COLUMNS of one row: for a sim at a time scale > 0 its figures
    back in simulated time (a simulated second takes `time_scale` wall seconds); NaN otherwise."""
    scale = time_scale if engine_kind == "sim" and time_scale else math.nan
    out: dict[str, Any] = {"engine_kind": engine_kind, "sim_time_scale": scale}
    for c in SIM_LATENCIES:
        out[f"simulated_{c}"] = float(metrics[c]) / scale
    for c in SIM_RATES:
        out[f"simulated_{c}"] = float(metrics[c]) * scale
    return out


def layout_figures(cell: CellRepeat, *, axes: Sequence[str]) -> dict[str, Any]:
    """LAYOUT_ARGS not among `axes`: the value of every role, or `prefill=X;decode=Y` when
    the roles differ."""
    out: dict[str, Any] = {}
    for arg in LAYOUT_ARGS:
        if arg in axes:
            continue
        values = {r.name: getattr(r.args, arg) for r in cell.server.roles}
        distinct = set(values.values())
        out[arg] = (
            distinct.pop()
            if len(distinct) == 1
            else ";".join(f"{k}={v}" for k, v in values.items())
        )
    return out


def check_record(record: BenchRecord | Mapping[str, Any]) -> list[str]:
    """Why a record cannot be analysed (missing required keys, nothing completed); [] if fine."""
    data = _fields(record)
    problems = [f"missing {key}" for key in REQUIRED_KEYS if data.get(key) is None]
    completed = data.get("completed")
    if isinstance(completed, int | float) and completed < 1:
        problems.append(f"completed = {completed}")
    return problems


def read_cell(
    path: Path,
    *,
    cell: CellRepeat,
    min_retokenized_ratio: float = MIN_RETOKENIZED_RATIO,
    measured_with: Mapping[str, Any] | None = None,
    stale: list[tuple[str, str, list[str]]] | None = None,
) -> tuple[dict[str, Any], tuple[Requests, stats.RequestDetails | None]]:
    """Read and check one raw cell-repeat file with the cell's own checks (validation.
    judge_record against its workload): its metrics, its per-request figures and details (None
    without usable details), TPOT and ITL blank where the workload does not stream;
    CellFailed names the cell and the file, and says to delete it.
    With `measured_with` (provenance.measured_with of the current config), a record measured
    with anything else is added to `stale` (cell, file, differences)."""
    delete = f"; delete {path} to rerun the cell"
    try:
        record = read_record(path)
        fields = _fields(record)
        metrics = record_metrics(fields, stream=cell.workload.stream)
    except FileNotFoundError:
        raise CellFailed(f"cell {cell.key}: raw record {path} is missing") from None
    except (ValueError, ValidationError) as exc:  # JSON, line count, field types
        first = str(exc).strip().splitlines()[0]
        raise CellFailed(
            f"cell {cell.key}: raw record {path} is invalid: {first}{delete}"
        ) from None
    problems = check_record(fields)
    if not problems:
        # The cell's checks; only the presence of per-request details is not required again
        # (requests.csv, and so the bootstrap, falls back to repeats without them).
        verdict = validation.judge_record(
            record,
            workload=cell.workload,
            min_retokenized_ratio=min_retokenized_ratio,
            need_details=False,
        )
        problems = verdict.problems
    if problems:
        shown = "; ".join(problems[: validation.MAX_SHOWN])
        raise CellFailed(f"cell {cell.key}: raw record {path} is invalid: {shown}{delete}")
    recorded = (record.model_extra or {}).get(provenance.KEY)
    # Equal mappings have no differences: the key-by-key diff only for a record that differs.
    if measured_with is not None and stale is not None and recorded != measured_with:
        diff = provenance.differences(recorded, measured_with)
        if diff:
            stale.append((cell.key, str(path), diff))
    details = _request_figures(path, record, stream=cell.workload.stream)
    return {**metrics, **hygiene_columns(record)}, details


def hygiene_columns(record: BenchRecord) -> dict[str, Any]:
    """What run_cell recorded about a cell's conditions: whether the radix cache was flushed
    before it, where its server's start went (`start_<phase>`), and its log evidence counts
    (`evidence_<name>`)."""
    extra = record.model_extra or {}
    flushed = extra.get(isolation.CACHE_FLUSHED_KEY)
    counts = extra.get(EVIDENCE_KEY) or {}
    started = extra.get(START_KEY) or {}
    return {
        "cache_flushed": math.nan if flushed is None else bool(flushed),
        **{f"start_{phase}": started.get(phase, math.nan) for phase in START_PHASES},
        **servermetrics.columns(extra.get(servermetrics.KEY)),
        **{f"{EVIDENCE_COLUMN_PREFIX}{name}": int(n) for name, n in counts.items()},
    }


def _request_figures(
    path: Path, record: BenchRecord, *, stream: bool
) -> tuple[Requests, stats.RequestDetails | None]:
    """Per-request figures of a checked record (requests.csv, the bootstrap) and its details
    (tails, goodput); None (with a warning) when its details do not validate: the bootstrap
    then falls back to repeats, and tails and goodput are NaN. Without `stream` no TPOT or ITL
    (stats.request_details)."""
    try:
        details = stats.request_details(record, stream=stream)
    except (ValueError, ValidationError) as exc:
        log.warning("%s: no per-request data (%s)", path, str(exc).splitlines()[0])
        return None, None
    return stats.successful_figures(details), details


def cell_gpu(path: Path, *, cell: CellRepeat, shared_by: str = "") -> dict[str, Any]:
    """GPU figures of one cell-repeat; a missing snapshot file gives NaN and status `missing`,
    one cut short `incomplete`; a malformed one is CellFailed naming the cell and the file.
    `shared_by`: the roles of its server set that share a GPU (gpu_figures)."""
    try:
        rows = gpufile.read_snapshot(path)
    except FileNotFoundError:
        log.warning("cell %s: no GPU snapshot %s", cell.key, path)
        return {**gpu_figures([], shared_by=shared_by), "gpu_status": "missing"}
    except ValueError as exc:  # names the file
        raise CellFailed(f"cell {cell.key}: {exc}; delete {path} to rerun the cell") from None
    found = gpu_figures(rows, shared_by=shared_by)
    if found["gpu_status"] == gpufile.STATUS_INCOMPLETE:
        log.warning(
            "cell %s: GPU snapshot %s is cut short (its before and after rows do not pair up): "
            "GPU figures left blank; delete it to rerun the cell",
            cell.key,
            path,
        )
    unread = unmeasured_clocks(rows)
    if found["gpu_status"] == gpufile.STATUS_CLOCK_UNMEASURED:
        why = "; ".join(f"node {node}: {detail}" for node, detail in unread.items())
        log.warning(
            "cell %s: GPU snapshot %s: a sampled node's clock could not be read (%s), so its "
            "samples cannot be placed in the measured window: energy and power left blank "
            "(gpu_status %s)",
            cell.key,
            path,
            why,
            found["gpu_status"],
        )
    return found


def _axis_names(axes: Iterable[Mapping[str, Any]]) -> list[str]:
    names: dict[str, None] = {}
    for a in axes:
        names.update(dict.fromkeys(a))
    return list(names)


def result_columns(server_axes: Sequence[str], client_axes: Sequence[str]) -> list[str]:
    """Column order of results.csv: ids, engine, server axes, client axes, the server's
    parallel layout, metrics, GPU figures, the per-request, energy and SLO figures, the sim's
    figures in simulated time."""
    return [
        *ID_COLUMNS,
        *ENGINE_COLUMNS,
        *server_axes,
        *client_axes,
        *(a for a in LAYOUT_ARGS if a not in server_axes),
        *METRICS,
        *DERIVED,
        *GPU_COLUMNS,
        *FIGURE_COLUMNS,
        *HYGIENE_COLUMNS,
        *START_COLUMNS,
        *servermetrics.COLUMNS,
        *SIM_COLUMNS,
    ]


def role_gpus(cell: CellRepeat) -> tuple[int, int]:
    """GPUs that did the prefill and the decode work of a cell's server: a PD set's prefill
    and decode roles; every GPU of the server for both otherwise (tp_size*pp_size per role)."""
    gpus = {r.name: r.args.tp_size * r.args.pp_size for r in cell.server.roles}
    total = sum(gpus.values())
    return gpus.get("prefill", total), gpus.get("decode", total)


# An event-loop lag delays the client's timestamps; below this share of the cell-repeat's
# median TTFT it cannot move the figures by more than that share. On a shared host the lag p99
# of an idle client (CPU 3-4% of a core) reached 12 ms against a TTFT p50 of ~600 ms: the lag
# limit alone flagged 15 of the default run's 24 cell-repeats.
LAG_SHARE_OF_TTFT = 0.05


def lag_limit_ms(metrics: Mapping[str, Any], limits: SaturationConfig) -> float:
    """The event-loop lag p99 above which a builtin client counts as saturated:
    `client.saturation.loop_lag_p99_ms`, or LAG_SHARE_OF_TTFT of the median TTFT if larger."""
    ttft = float(metrics.get("ttft_p50_ms", math.nan))
    share = LAG_SHARE_OF_TTFT * ttft if math.isfinite(ttft) else 0.0
    return max(limits.loop_lag_p99_ms, share)


def _saturated(metrics: Mapping[str, Any], limits: SaturationConfig) -> float | bool:
    """client_saturated of one cell-repeat (selfcheck.saturated: the builtin's in-window
    self-check, its lag against lag_limit_ms, else the whole-process CPU% from outside):
    True/False, NaN with neither."""
    flag = selfcheck.saturated(
        metrics, loop_lag_p99_ms=lag_limit_ms(metrics, limits), cpu_pct=limits.cpu_pct
    )
    return math.nan if flag is None else flag


def cell_figures(
    *,
    cell: CellRepeat,
    metrics: Mapping[str, Any],
    gpu: Mapping[str, Any],
    details: stats.RequestDetails | None,
    slo: SloConfig,
    saturation: SaturationConfig,
) -> dict[str, Any]:
    """FIGURE_COLUMNS of one cell-repeat (pure)."""
    prefill, decode = role_gpus(cell)
    tails = figures.tail_figures(details)
    return {
        **{c: tails[c] for c in TAIL_COLUMNS},
        **figures.efficiency_figures(
            metrics=metrics, gpu=gpu, prefill_gpus=prefill, decode_gpus=decode
        ),
        **figures.goodput_figures(details, slo=slo, duration_s=float(metrics["duration_s"])),
        "client_saturated": _saturated(metrics, saturation),
        "tpot_zero": tpot_zero(metrics, workload=cell.workload),
    }


def tpot_zero(metrics: Mapping[str, Any], *, workload: Workload) -> bool:
    """Whether a cell-repeat that streams outputs of more than one token has a TPOT p50 of
    0.00 ms (ZERO_TPOT_MS): a measurement error (its tokens came in one piece, e.g. through a
    buffering router), never a decode speed. False where TPOT is undefined (NaN)."""
    tpot = float(metrics.get("tpot_p50_ms", math.nan))
    return workload.stream and workload.output_len > 1 and tpot < ZERO_TPOT_MS


def result_row(
    *,
    run_id: str,
    cell: CellRepeat,
    metrics: Mapping[str, Any],
    gpu: Mapping[str, Any],
    engine: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One results.csv row (pure); `engine`: its engine_figures."""
    return {
        "run_id": run_id,
        "server_id": cell.server.id,
        "client_id": cell.client.id,
        "repeat": cell.repeat,
        "seed": cell.seed,
        "fingerprint": cell.server.fingerprint,
        "pool": cell.server.pool,  # the node pool it ran in (servesweep.cluster.pools)
        **(engine or {}),
        **cell.server.axes,
        **cell.client.axes,
        **layout_figures(cell, axes=list(cell.server.axes)),
        **metrics,
        **gpu,
    }


def collect_results(
    *,
    run_id: str,
    cells: Sequence[CellRepeat],
    raw: Sequence[Path],
    gpu: Sequence[Path],
    min_retokenized_ratio: float = MIN_RETOKENIZED_RATIO,
    measured_with: Sequence[Mapping[str, Any]] | None = None,
    slo: SloConfig | None = None,
    saturation: SaturationConfig | None = None,
    engine_kind: str = "sglang",
    time_scale: float | None = None,
    workers: int = 1,
    cluster: ClusterConfig | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """results.csv (one row per cell-repeat) and requests.csv (one row per successful request)
    of a run, from the raw records and GPU files of `cells` (in the same order); goodput
    against `slo` (NaN without one); `client_saturated` against `saturation`; the engine's
    kind and, for the sim, its `time_scale` (engine_figures); with the `cluster`, the roles
    of each server set that share a GPU (`gpu_shared_by`, cluster.gpu_ids).

    `measured_with`: per cell, what the current config measures it with; records measured
    with anything else are one CellFailed naming the cells and the differing keys. The cells
    are read in `workers` processes (core.parallel)."""
    slo, saturation = slo or SloConfig(), saturation or SaturationConfig()
    if not len(cells) == len(raw) == len(gpu):
        raise ValueError(f"{len(cells)} cells, {len(raw)} raw files, {len(gpu)} GPU files")
    server_axes = _axis_names(c.server.axes for c in cells)
    client_axes = _axis_names(c.client.axes for c in cells)
    expected = list(measured_with) if measured_with is not None else [None] * len(cells)
    read = partial(
        _read_cells,
        run_id=run_id,
        min_retokenized_ratio=min_retokenized_ratio,
        slo=slo,
        saturation=saturation,
        engine_kind=engine_kind,
        time_scale=time_scale,
        cluster=cluster,
    )
    items = list(zip(cells, raw, gpu, expected, strict=True))
    read_rows = map_chunks(read, items, workers=workers, what="reading the raw records")
    rows = [row for row, _, _ in read_rows]
    requests = [per_request for _, per_request, _ in read_rows]
    stale = [s for _, _, found in read_rows for s in found]
    provenance.check_current(stale)
    columns = result_columns(server_axes, client_axes)
    found = dict.fromkeys(k for row in rows for k in row if k.startswith(EVIDENCE_COLUMN_PREFIX))
    df = pd.DataFrame(rows, columns=[*columns, *found])
    for col in (*INTEGER_METRICS, "gpu_count"):
        df[col] = pd.to_numeric(df[col]).astype("Int64")
    df = significant(df)
    log.info("collected %d cell-repeats of run %s", len(df), run_id)
    keys = [(c.server.id, c.client.id, c.repeat) for c in cells]
    return df, request_table(keys, requests)


def _read_cells(
    items: Sequence[tuple[CellRepeat, Path, Path, Mapping[str, Any] | None]],
    *,
    run_id: str,
    min_retokenized_ratio: float,
    slo: SloConfig,
    saturation: SaturationConfig,
    engine_kind: str,
    time_scale: float | None,
    cluster: ClusterConfig | None = None,
) -> list[tuple[dict[str, Any], Requests, list[tuple[str, str, list[str]]]]]:
    """Per (cell, raw file, GPU file, measured_with): its results.csv row, its per-request
    figures and the stale findings of its record (provenance.check_current)."""
    out = []
    sharing: dict[str, str] = {}  # server id -> its roles that share a GPU
    for cell, raw_path, gpu_path, want in items:
        if cluster is not None and cell.server.id not in sharing:
            roles = [(r.name, r.nodes) for r in cell.server.roles]
            sharing[cell.server.id] = gpu_shared_by(cluster, roles)
        stale: list[tuple[str, str, list[str]]] = []
        metrics, (per_request, details) = read_cell(
            Path(raw_path),
            cell=cell,
            min_retokenized_ratio=min_retokenized_ratio,
            measured_with=want,
            stale=stale,
        )
        gpu_row = cell_gpu(Path(gpu_path), cell=cell, shared_by=sharing.get(cell.server.id, ""))
        extra = cell_figures(
            cell=cell,
            metrics=metrics,
            gpu=gpu_row,
            details=details,
            slo=slo,
            saturation=saturation,
        )
        if extra["tpot_zero"]:
            log.warning(
                "cell %s: TPOT p50 %.4f ms of streamed outputs of %d tokens: a measurement "
                "error (tokens arrived at once), flagged tpot_zero",
                cell.key,
                metrics["tpot_p50_ms"],
                cell.workload.output_len,
            )
        engine = engine_figures(metrics, engine_kind=engine_kind, time_scale=time_scale)
        row = result_row(
            run_id=run_id, cell=cell, metrics=metrics, gpu={**gpu_row, **extra}, engine=engine
        )
        out.append((row, per_request, stale))
    return out


def request_table(
    keys: Sequence[tuple[str, str, int]], requests: Sequence[Requests]
) -> pd.DataFrame:
    """requests.csv: the per-request figures of each cell-repeat (`keys`: its server_id,
    client_id and repeat, as in results.csv)."""
    have = [(k, f) for k, f in zip(keys, requests, strict=True) if f is not None]
    if len(have) < len(keys):
        log.warning(
            "%d of %d cell-repeats have no per-request details", len(keys) - len(have), len(keys)
        )
    sizes = [len(f[0]) for _, f in have]
    columns: dict[str, Any] = {
        "server_id": np.repeat([k[0] for k, _ in have], sizes).astype(object),
        "client_id": np.repeat([k[1] for k, _ in have], sizes).astype(object),
        "repeat": np.repeat(np.array([k[2] for k, _ in have], dtype=np.int64), sizes),
    }
    for i, name in enumerate(REQUEST_COLUMNS[len(REQUEST_ID_COLUMNS) :]):
        columns[name] = np.concatenate([f[i] for _, f in have]) if have else np.array([], float)
    return pd.DataFrame(columns, columns=list(REQUEST_COLUMNS))


def significant(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with every float column rounded to SIGNIFICANT_DIGITS: the values results.csv
    holds, so a table summarized in memory equals the one read back from the file."""
    out = df.copy()
    spec = f"%.{SIGNIFICANT_DIGITS - 1}e"
    for col in out.columns:
        if pd.api.types.is_float_dtype(out[col]):
            values = out[col].to_numpy(dtype=float).tolist()
            out[col] = np.array([float(spec % v) for v in values], dtype=float)
    return out


def _significant(value: float) -> str:
    return np.format_float_positional(
        value, precision=SIGNIFICANT_DIGITS, unique=True, fractional=False, trim="0"
    )


def write_results_csv(df: pd.DataFrame, path: str | Path) -> None:
    """Write results.csv atomically, floats to SIGNIFICANT_DIGITS (never in exponent form)."""
    with atomic_open(path) as fh:
        df.to_csv(fh, index=False, float_format=_significant)


def write_requests_csv(df: pd.DataFrame, path: str | Path) -> None:
    """Write requests.csv atomically (floats in their shortest exact form), the text of
    df.to_csv(index=False) (tablecsv: each cell-repeat's ids formatted once)."""
    with atomic_open(path) as fh:
        fh.write(runs_csv_text(df, ids=len(REQUEST_ID_COLUMNS)))
