"""GPU snapshots per node: the nvidia-smi query, its parsers, snapshot files and row values."""

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
    # Not an nvidia-smi field: a `clock` row's node clock minus the workflow host's (seconds).
    "clock.offset": "clock_offset_s",
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
    return [_MISSING_ROW | meta | gpu for gpu in gpus]


def visible_rows(
    rows: Iterable[Mapping[str, Any]], visible: Mapping[str, Sequence[int] | None]
) -> list[dict[str, Any]]:
    """Rows of only the GPUs each node has (`visible`: node -> its host GPU indices, None:
    all): a node that is a slice of its host shares nvidia-smi's answer with the others.
    Rows without a GPU (unavailable, window marks) are kept."""
    out = []
    for row in rows:
        ids = visible.get(str(row.get("node")))
        index = row.get("index")
        if ids is not None and not missing(index) and int(index) not in ids:
            continue
        out.append(dict(row))
    return out


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
