"""The GPU file of a cell-repeat (gpu/<server>/<client>/r<k>.csv), as run_cell writes it and
the analysis reads it: nvidia-smi's fields as columns, the rows' phases (snapshots before and
after, loop samples, the measured window, node clocks) and statuses, and its timestamps."""

from __future__ import annotations

import csv
import io
import math
import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from servesweep.core.files import atomic_open

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
    # Not an nvidia-smi field: a `clock` row's node clock minus the workflow host's (seconds).
    "clock.offset": "clock_offset_s",
}
STRING_FIELDS = frozenset({"timestamp", "uuid", "name", "pci.bus_id", "driver_version", "pstate"})
META_COLUMNS = ("node", "phase", "status", "detail")
SNAPSHOT_COLUMNS = (*META_COLUMNS, *COLUMNS.values())
FIELD_OF_COLUMN = {col: field for field, col in COLUMNS.items()}
# A snapshot row with every value missing (parse_snapshot fills in what a file has).
MISSING_ROW: dict[str, Any] = {
    col: None if col in META_COLUMNS or FIELD_OF_COLUMN[col] in STRING_FIELDS else math.nan
    for col in SNAPSHOT_COLUMNS
} | {"detail": ""}
PHASES = ("before", "after")
STATUS_OK = "ok"
STATUS_UNAVAILABLE = "unavailable"
STATUS_PARTIAL = "partial"
STATUS_INCOMPLETE = "incomplete"  # a node's before or after rows are missing (a cut file)
STATUS_SIMULATED = "simulated"  # the local sim's power curve (gpusampling), never measured
# A node's GPUs were sampled but its clock could not be read (cluster.clocks): its samples
# cannot be placed in the measured window, so the cell's energy and power are not figures.
STATUS_CLOCK_UNMEASURED = "clock-unmeasured"
STATUSES = (STATUS_OK, STATUS_UNAVAILABLE, STATUS_SIMULATED)
# Rows of a GPU file besides the before/after snapshots: loop samples during the cell, and the
# client's measured window (timestamp only; gpusampling writes and reads them).
PHASE_SAMPLE = "sample"
PHASE_WINDOW_START = "window-start"
PHASE_WINDOW_END = "window-end"
WINDOW_PHASES = (PHASE_WINDOW_START, PHASE_WINDOW_END)
# A node's clock offset to the workflow host's, measured in the cell (cluster.clocks): the
# window is in the host's clock, a node's samples in its own.
PHASE_CLOCK = "clock"
ROW_PHASES = (*PHASES, PHASE_SAMPLE, *WINDOW_PHASES, PHASE_CLOCK)
# nvidia-smi's timestamp; the loop runs with TZ=UTC, so it is UTC.
TIMESTAMP_FORMAT = "%Y/%m/%d %H:%M:%S.%f"


def format_timestamp(epoch_s: float) -> str:
    """An epoch time as nvidia-smi prints its timestamp (UTC, milliseconds)."""
    return datetime.fromtimestamp(epoch_s, UTC).strftime(TIMESTAMP_FORMAT)[:-3]


def parse_timestamp(text: str) -> float:
    """nvidia-smi's `2026/12/01 14:13:27.970` (printed with TZ=UTC) as epoch seconds."""
    return datetime.strptime(text.strip(), TIMESTAMP_FORMAT).replace(tzinfo=UTC).timestamp()


def parse_number(field: str, text: str) -> float:
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


def missing(value: Any) -> bool:
    """Whether a row value is missing: None, NaN, or pandas' NA (a typed frame's records)."""
    if isinstance(value, float):
        return math.isnan(value)
    pandas = sys.modules.get("pandas")  # a pd.NA exists only if something imported pandas
    return value is None or (pandas is not None and value is pandas.NA)


def _csv_value(value: Any) -> str:
    """One value as write_snapshot writes it: missing is empty; str() of a float reads back
    equal (shortest repr), also for numpy floats, whose repr the csv module would write."""
    return "" if missing(value) else str(value)


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
        row = dict(MISSING_ROW)
        for i, col, field in kept:
            text = cells[i]
            if not text:
                continue  # missing: as in MISSING_ROW
            if field is None or field in STRING_FIELDS:
                row[col] = text
                continue
            try:
                row[col] = parse_number(field, text)
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


def text_of(value: Any) -> str:
    """A text value of a row; missing (None, NA) is ""."""
    return value if isinstance(value, str) else ""


def number_of(value: Any) -> float:
    """A numeric value of a row as a float; NaN where missing (None, NA, NaN) or not a number."""
    if missing(value):
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan
