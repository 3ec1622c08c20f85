"""GPU snapshots per node: the nvidia-smi query, its parsers, snapshot files and row values."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from servesweep.core.gpufile import (
    COLUMNS,
    META_COLUMNS,
    MISSING_ROW,
    PHASES,
    QUERY_FIELDS,
    SNAPSHOT_COLUMNS,
    STATUS_OK,
    STATUS_UNAVAILABLE,
    STRING_FIELDS,
    missing,
    parse_number,
)

if TYPE_CHECKING:
    # pandas (~0.25 s) only for snapshot_frame: run_cell, one process per cell, never needs it;
    # transport imports paramiko (~0.1 s): the analysis scripts never need it.
    import pandas as pd

    from servesweep.cluster.transport import CommandResult, Transport


# Header names nvidia-smi prints for some query names (seen in the recorded `--format=csv`).
HEADER_ALIASES = {
    "clocks.current.sm": "clocks.sm",
    "clocks.current.memory": "clocks.mem",
    "clocks.current.graphics": "clocks.gr",
}
# Exit codes of `sh -c` when the command is missing (127) or not executable (126).
NOT_FOUND_CODES = (126, 127)


def snapshot_command() -> str:
    """The nvidia-smi command one snapshot runs on every node."""
    return f"nvidia-smi --query-gpu={','.join(QUERY_FIELDS)} --format=csv,noheader,nounits"


# ---------------------------------------------------------------- parsing


def _value(field: str, text: str) -> Any:
    if field in STRING_FIELDS or field not in COLUMNS:  # text, or a field we do not type
        return text.strip()
    return parse_number(field, text)


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
    return [MISSING_ROW | meta]


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
    return [MISSING_ROW | meta | gpu for gpu in gpus]


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
