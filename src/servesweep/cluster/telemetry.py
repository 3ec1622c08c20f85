"""GPU snapshots per node: nvidia-smi query, parsers, snapshot files and per-cell figures."""

from __future__ import annotations

import csv
import io
import math
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servesweep.core.files import atomic_open

if TYPE_CHECKING:
    # pandas (~0.25 s) only for snapshot_frame: run_cell, one process per cell, never needs it;
    # transport imports paramiko (~0.1 s): the analysis scripts never need it.
    import pandas as pd

    from servesweep.cluster.transport import CommandResult, Transport


# nvidia-smi --query-gpu fields, in the order the command asks for them (and noheader prints).
QUERY_FIELDS: tuple[str, ...] = (
    "timestamp",
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "driver_version",
    "memory.total",
    "memory.used",
    "memory.free",
    "utilization.gpu",
    "utilization.memory",
    "temperature.gpu",
    "power.draw",
    "power.limit",
    "clocks.sm",
    "clocks.mem",
    "pstate",
)
# Query field -> row key and CSV column (units in the name, as nvidia-smi's `nounits` drops them).
COLUMNS: dict[str, str] = {
    "timestamp": "timestamp",
    "index": "index",
    "uuid": "uuid",
    "name": "name",
    "pci.bus_id": "pci_bus_id",
    "driver_version": "driver_version",
    "memory.total": "memory_total_mib",
    "memory.used": "memory_used_mib",
    "memory.free": "memory_free_mib",
    "utilization.gpu": "utilization_gpu_pct",
    "utilization.memory": "utilization_memory_pct",
    "temperature.gpu": "temperature_gpu_c",
    "power.draw": "power_draw_w",
    "power.limit": "power_limit_w",
    "clocks.sm": "clocks_sm_mhz",
    "clocks.mem": "clocks_mem_mhz",
    "pstate": "pstate",
}
STRING_FIELDS = frozenset({"timestamp", "uuid", "name", "pci.bus_id", "driver_version", "pstate"})
# Header names nvidia-smi prints for some query names (seen in the recorded `--format=csv`).
HEADER_ALIASES = {
    "clocks.current.sm": "clocks.sm",
    "clocks.current.memory": "clocks.mem",
    "clocks.current.graphics": "clocks.gr",
}
META_COLUMNS = ("node", "phase", "status", "detail")
SNAPSHOT_COLUMNS = (*META_COLUMNS, *COLUMNS.values())
FIELD_OF_COLUMN = {col: field for field, col in COLUMNS.items()}
# A snapshot row with every value missing (parse_snapshot fills in what a file has).
_MISSING_ROW: dict[str, Any] = {
    col: None if col in META_COLUMNS or FIELD_OF_COLUMN[col] in STRING_FIELDS else math.nan
    for col in SNAPSHOT_COLUMNS
} | {"detail": ""}
PHASES = ("before", "after")
STATUS_OK = "ok"
STATUS_UNAVAILABLE = "unavailable"
STATUS_PARTIAL = "partial"
STATUS_INCOMPLETE = "incomplete"  # a node's before or after rows are missing (a cut file)
STATUS_SIMULATED = "simulated"  # the local sim's power curve (gpusampling), never measured
STATUSES = (STATUS_OK, STATUS_UNAVAILABLE, STATUS_SIMULATED)
# Rows of a GPU file besides the before/after snapshots: loop samples during the cell, and the
# client's measured window (timestamp only; gpusampling writes and reads them).
PHASE_SAMPLE = "sample"
PHASE_WINDOW_START = "window-start"
PHASE_WINDOW_END = "window-end"
WINDOW_PHASES = (PHASE_WINDOW_START, PHASE_WINDOW_END)
ROW_PHASES = (*PHASES, PHASE_SAMPLE, *WINDOW_PHASES)
GPU_FIGURES = (
    "gpu_count",
    "gpu_mem_used_peak_mib",
    "gpu_power_peak_w",
    "gpu_util_mean_pct",
    "gpu_status",
)
# Exit codes of `sh -c` when the command is missing (127) or not executable (126).
NOT_FOUND_CODES = (126, 127)


def snapshot_command() -> str:
    """The nvidia-smi command one snapshot runs on every node."""
    return f"nvidia-smi --query-gpu={','.join(QUERY_FIELDS)} --format=csv,noheader,nounits"


# ---------------------------------------------------------------- parsing


def _number(field: str, text: str) -> float:
    """One numeric value, with or without its unit; `[N/A]`-style values are NaN."""
    try:
        return float(text)  # the common case: a bare number
    except ValueError:
        pass
    value = text.strip()
    if not value or value.strip("[]") in ("N/A", "Not Supported", "Unknown Error", "Unknown"):
        return math.nan
    if value.startswith("[") and value.endswith("]"):
        return math.nan
    try:
        return float(value.split()[0])
    except ValueError:
        raise ValueError(f"field {field}: not a number: {text!r}") from None


def _value(field: str, text: str) -> Any:
    if field in STRING_FIELDS or field not in COLUMNS:  # text, or a field we do not type
        return text.strip()
    return _number(field, text)


def _rows(lines: Iterable[list[str]], fields: Sequence[str]) -> list[dict[str, Any]]:
    rows = []
    for n, cells in enumerate(lines, start=1):  # n: data row number, for messages
        if not cells or all(not c.strip() for c in cells):
            continue
        if len(cells) != len(fields):
            raise ValueError(
                f"row {n}: {len(cells)} values for {len(fields)} fields: {', '.join(cells)}"
            )
        rows.append({COLUMNS.get(f, f): _value(f, c) for f, c in zip(fields, cells, strict=True)})
    return rows


def _reader(text: str) -> Iterator[list[str]]:
    return csv.reader(io.StringIO(text), skipinitialspace=True)


def _header_field(name: str) -> str:
    """`memory.used [MiB]` -> `memory.used`; `clocks.current.sm [MHz]` -> `clocks.sm`."""
    bare = name.split(" [", 1)[0].strip()
    return HEADER_ALIASES.get(bare, bare)


def parse_noheader(text: str, *, fields: Sequence[str] = QUERY_FIELDS) -> list[dict[str, Any]]:
    """Rows of `--format=csv,noheader,nounits` output (one line per GPU) for `fields`.

    Keys are the COLUMNS of `fields`; numbers are floats (NaN for `[N/A]`-style), text is str.
    """
    return _rows(_reader(text), fields)


def parse_with_header(text: str) -> list[dict[str, Any]]:
    """Rows of `--format=csv` output (header line, values with units), any subset of fields."""
    lines = list(_reader(text))
    if not lines:
        raise ValueError("empty nvidia-smi output (expected a header line)")
    fields = [_header_field(h) for h in lines[0]]
    return _rows(lines[1:], fields)


def _typed(df: pd.DataFrame) -> pd.DataFrame:
    """Column types of a snapshot frame: numbers float (index Int64), text nullable strings."""
    import pandas as pd  # only here and in snapshot_frame: see the TYPE_CHECKING import

    out = df.copy()
    for field, col in COLUMNS.items():
        if col not in out.columns:
            continue
        if field in STRING_FIELDS:
            out[col] = out[col].astype("string")
        elif field == "index":
            out[col] = pd.to_numeric(out[col]).astype("Int64")
        else:
            out[col] = pd.to_numeric(out[col]).astype("float64")
    for col in META_COLUMNS:
        if col in out.columns:
            out[col] = out[col].astype("string")
    if "detail" in out.columns:
        out["detail"] = out["detail"].fillna("")
    return out


# ---------------------------------------------------------------- snapshots


def _unavailable(node: str, phase: str, detail: str) -> list[dict[str, Any]]:
    meta = {"node": node, "phase": phase, "status": STATUS_UNAVAILABLE, "detail": detail}
    return [_MISSING_ROW | meta]


def node_rows(result: CommandResult, *, phase: str) -> list[dict[str, Any]]:
    """Snapshot rows of one node from its nvidia-smi result; failures give one honest row.

    Every row has every SNAPSHOT_COLUMNS key, in that order."""
    node = result.node
    if result.returncode in NOT_FOUND_CODES:
        return _unavailable(node, phase, f"nvidia-smi not found on node {node}")
    if not result.ok:
        tail = " | ".join((result.stderr or result.stdout).strip().splitlines()[-2:])
        return _unavailable(
            node, phase, f"nvidia-smi failed on node {node} (exit {result.returncode}): {tail}"
        )
    try:
        gpus = parse_noheader(result.stdout)
    except ValueError as exc:
        return _unavailable(node, phase, f"nvidia-smi output on node {node} not parsed: {exc}")
    if not gpus:
        return _unavailable(node, phase, f"nvidia-smi listed no GPUs on node {node}")
    meta = {"node": node, "phase": phase, "status": STATUS_OK, "detail": ""}
    return [{**meta, **gpu} for gpu in gpus]


def snapshot_frame(rows: Iterable[Mapping[str, Any]]) -> pd.DataFrame:
    """A typed snapshot frame with every column of SNAPSHOT_COLUMNS, from row dicts."""
    import pandas as pd  # only here and in _typed: see the TYPE_CHECKING import

    return _typed(pd.DataFrame(list(rows), columns=list(SNAPSHOT_COLUMNS)))


def take_snapshot(
    *, transport: Transport, nodes: Sequence[str], phase: str, timeout: float = 30.0
) -> list[dict[str, Any]]:
    """Query every node's GPUs in parallel; one row per GPU, or one `unavailable` row per node
    (rows as node_rows gives them, nodes in the order given).

    Transport failures (unreachable node, timeout) raise TransportError: they are not
    telemetry gaps but a broken cluster.
    """
    from servesweep.cluster.transport import run_all

    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, not {phase!r}")
    results = run_all(transport, nodes, snapshot_command(), timeout=timeout)
    return [row for res in results.values() for row in node_rows(res, phase=phase)]


def _missing(value: Any) -> bool:
    """Whether a row value is missing: None, NaN, or pandas' NA (a typed frame's records)."""
    if isinstance(value, float):
        return math.isnan(value)
    pandas = sys.modules.get("pandas")  # a pd.NA exists only if something imported pandas
    return value is None or (pandas is not None and value is pandas.NA)


def _csv_value(value: Any) -> str:
    """One value as write_snapshot writes it: missing is empty; str() of a float reads back
    equal (shortest repr), also for numpy floats, whose repr the csv module would write."""
    return "" if _missing(value) else str(value)


def write_snapshot(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """Write snapshot rows (e.g. before and after) as CSV with SNAPSHOT_COLUMNS, atomically.

    Absent keys and missing values (None, NaN, pandas' NA) are empty; other keys are left out.
    """
    with atomic_open(path) as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(SNAPSHOT_COLUMNS)
        writer.writerows([_csv_value(row.get(col)) for col in SNAPSHOT_COLUMNS] for row in rows)


def parse_snapshot(text: str) -> list[dict[str, Any]]:
    """Rows of a snapshot CSV as `write_snapshot` writes it (a header of SNAPSHOT_COLUMNS).

    Every row has every SNAPSHOT_COLUMNS key: numbers are floats (NaN when empty or
    `[N/A]`-style), text is a str or None when empty (`detail` is "" then). Unknown columns
    are ignored, absent ones are missing values; a row with more or fewer values than the
    header is a ValueError naming the row.
    """
    lines = csv.reader(io.StringIO(text))
    header = next(lines, None)
    if not header:
        raise ValueError("empty GPU snapshot (expected a header line)")
    kept = [
        (i, col, FIELD_OF_COLUMN.get(col))
        for i, col in enumerate(header)
        if col in SNAPSHOT_COLUMNS
    ]
    rows = []
    for n, cells in enumerate(lines, start=1):  # n: data row number, for messages
        if not cells or all(not c.strip() for c in cells):
            continue
        if len(cells) != len(header):
            raise ValueError(f"row {n}: {len(cells)} values for {len(header)} columns")
        row = dict(_MISSING_ROW)
        for i, col, field in kept:
            text = cells[i]
            if not text:
                continue  # missing: as in _MISSING_ROW
            if field is None or field in STRING_FIELDS:
                row[col] = text
                continue
            try:
                row[col] = _number(field, text)
            except ValueError as exc:
                raise ValueError(f"row {n}: {exc}") from None
        if row["phase"] not in ROW_PHASES:
            raise ValueError(f"row {n}: phase {row['phase']!r} is not one of {ROW_PHASES}")
        if row["phase"] in WINDOW_PHASES:
            rows.append(row)
            continue
        if row["status"] not in STATUSES:
            raise ValueError(f"row {n}: status {row['status']!r} is not one of {STATUSES}")
        if not row["node"]:
            raise ValueError(f"row {n}: no node")
        rows.append(row)
    missing = [c for c in META_COLUMNS if c not in header]
    if missing:
        raise ValueError(f"header lacks {', '.join(missing)}")
    return rows


def read_snapshot(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a snapshot file (see parse_snapshot); `snapshot_frame` makes a typed frame.
    Undecodable bytes and malformed rows are a ValueError naming the file."""
    try:
        return parse_snapshot(Path(path).read_bytes().decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError and csv.Error included
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ValueError(f"GPU snapshot {path}: {first}") from None
    except csv.Error as exc:
        raise ValueError(f"GPU snapshot {path}: {exc}") from None


# ---------------------------------------------------------------- figures


def _text(value: Any) -> str:
    """A text value of a row; missing (None, NA) is ""."""
    return value if isinstance(value, str) else ""


def _present(value: Any) -> float | None:
    """A numeric value of a row as a float; None where missing (None, NA, NaN)."""
    return None if _missing(value) else float(value)


def _values(rows: Iterable[Mapping[str, Any]], column: str) -> list[float]:
    """The values of a numeric column that are present (missing ones left out)."""
    values = (_present(r.get(column)) for r in rows)
    return [v for v in values if v is not None]


def cell_figures(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """gpu_figures of a cell's whole snapshot (before + after rows); `incomplete` (never `ok`)
    when a node's before and after rows do not pair up (a file cut short)."""
    figures = gpu_figures(rows)
    if not _paired(rows):
        figures["gpu_status"] = STATUS_INCOMPLETE
    return figures


def _paired(rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether every node has as many rows after the client as before it (and some)."""
    counts: dict[tuple[str, str], int] = {}
    for r in rows:
        if _text(r.get("phase")) not in PHASES:
            continue  # loop samples and the measured window
        key = (_text(r.get("node")), _text(r.get("phase")))
        counts[key] = counts.get(key, 0) + 1
    nodes = {node for node, _ in counts}
    return all(counts.get((n, "before"), 0) == counts.get((n, "after"), 0) > 0 for n in nodes)


def gpu_figures(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Per-cell GPU figures for results.csv; NaN (never guessed) where no GPU was read.

    `rows` are snapshot rows (read_snapshot, node_rows; a frame's `.to_dict("records")`).
    `gpu_status` is `ok` when every node answered, `unavailable` when none did, and `partial`
    when some did (figures then cover the GPUs that answered).
    """
    snapshot = [r for r in rows if _text(r.get("phase")) in PHASES]  # not loop samples
    ok = [r for r in snapshot if _text(r.get("status")) == STATUS_OK]
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
    util = _values((r for r in ok if _text(r.get("phase")) == "after"), "utilization_gpu_pct")
    return {
        "gpu_count": len({(_text(r.get("node")), _present(r.get("index"))) for r in ok}),
        "gpu_mem_used_peak_mib": max(memory) if memory else math.nan,
        "gpu_power_peak_w": max(power) if power else math.nan,
        "gpu_util_mean_pct": math.fsum(util) / len(util) if util else math.nan,
        "gpu_status": STATUS_OK if len(ok) == len(snapshot) else STATUS_PARTIAL,
    }
