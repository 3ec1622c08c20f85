"""What a raw record was measured with (fingerprint, workload, client, warm-up), and its check."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from servesweep import __version__
from servesweep.config.experiment import Experiment
from servesweep.config.matrix import CellRepeat, workload_key
from servesweep.core.errors import CellFailed

# The raw record's key holding measured_with(); records without it cannot be checked.
KEY = "servesweep_measured_with"


def client_identity(exp: Experiment) -> dict[str, str]:
    """The load generator of a run: kind, its version, the tokenizer it counts with."""
    version = exp.engine.version if exp.client.kind == "bench_serving" else __version__
    return {
        "kind": exp.client.kind,
        "version": version,
        "tokenizer": exp.client.tokenizer or exp.engine.model_path,
    }


def measured_with(exp: Experiment, cell: CellRepeat) -> dict[str, Any]:
    """What a cell-repeat is measured with, as JSON values (written into its raw record)."""
    return {
        "fingerprint": cell.server.fingerprint,
        "workload": json.loads(workload_key(cell.workload)),  # the measured part (its seed)
        "client": client_identity(exp),
        "warmup_after_start": exp.warmup_after_start,
    }


class CellParams:
    """run_cell's params of every cell-repeat of `cells` (key -> cell), as Snakemake asks for
    them once per job: computed once per config and cell. The client, the warm-up and each
    (client config, repeat)'s workload are shared by many cells (10 server configs of a 10k
    matrix: 1,000 workloads), so a cell costs a dict lookup and one small JSON dump. Values
    equal workload_key(cell.workload) and json.dumps(measured_with(exp, cell), sort_keys=True).
    """

    def __init__(self, exp: Experiment, cells: Mapping[str, CellRepeat]) -> None:
        self._cells = cells
        self._client = client_identity(exp)
        self._warmup = exp.warmup_after_start
        # id(client spec), repeat -> (workload_key, its JSON value, its sorted-key JSON); the
        # cells hold the specs
        self._workloads: dict[tuple[int, int], tuple[str, Any, str]] = {}
        self._measured: dict[str, str] = {}
        # measured_with's sorted-key JSON around the per-cell parts: the keys in sorted order,
        # json.dumps' default separators (a test compares it with json.dumps of value())
        self._head = f'{{"client": {json.dumps(self._client, sort_keys=True)}, "fingerprint": '
        self._middle = f', "warmup_after_start": {json.dumps(self._warmup)}, "workload": '

    def _workload(self, cell: CellRepeat) -> tuple[str, Any, str]:
        at = (id(cell.client), cell.repeat)
        found = self._workloads.get(at)
        if found is None:
            text = workload_key(cell.workload)
            value = json.loads(text)
            found = self._workloads[at] = (text, value, json.dumps(value, sort_keys=True))
        return found

    def fingerprint(self, key: str) -> str:
        return self._cells[key].server.fingerprint

    def workload(self, key: str) -> str:
        """workload_key of the cell's workload (its seed included)."""
        return self._workload(self._cells[key])[0]

    def value(self, key: str) -> dict[str, Any]:
        """measured_with() of the cell (its workload's value shared with other cells: read,
        never change it)."""
        cell = self._cells[key]
        return {
            "fingerprint": cell.server.fingerprint,
            "workload": self._workload(cell)[1],
            "client": self._client,
            "warmup_after_start": self._warmup,
        }

    def measured_with(self, key: str) -> str:
        """measured_with() of the cell as sorted-key JSON."""
        found = self._measured.get(key)
        if found is None:
            cell = self._cells[key]
            fingerprint = json.dumps(cell.server.fingerprint)
            workload = self._workload(cell)[2]
            found = f"{self._head}{fingerprint}{self._middle}{workload}}}"
            self._measured[key] = found
        return found


# The record's last bytes read for KEY: it follows the per-request details (cells.py adds it
# last but for a few small keys), so the planner reads no record whole.
TAIL_BYTES = 1 << 16


def recorded(path: str | Path) -> Any:
    """KEY's value in the raw record at `path` (None when the record has none); from the
    record's tail when it is there, else the whole record. OSError, ValueError as raised."""
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(0, size - TAIL_BYTES))
        tail = fh.read().decode("utf-8", errors="replace")
        at = tail.rfind(f'"{KEY}":')
        if at >= 0:
            rest = tail[at + len(KEY) + 3 :].lstrip()
            with contextlib.suppress(ValueError):
                return json.JSONDecoder().raw_decode(rest)[0]
        fh.seek(0)
        data = json.loads(fh.readline())
    return data.get(KEY) if isinstance(data, dict) else None


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out |= _flat(v, f"{prefix}{k}.")
        return out
    return {prefix.rstrip("."): value}


def differences(recorded: Any, expected: Mapping[str, Any]) -> list[str]:
    """`key: recorded -> now` for every key that differs ([] when the record matches)."""
    if not isinstance(recorded, Mapping):
        return [f"{KEY}: absent (measured before records carried their configuration)"]
    got, want = _flat(recorded), _flat(expected)
    return [
        f"{k}: {got.get(k)!r} -> {want.get(k)!r}"
        for k in sorted(set(got) | set(want))
        if got.get(k) != want.get(k)
    ]


def check_current(stale: Sequence[tuple[str, str, list[str]]]) -> None:
    """One CellFailed line for every (cell, raw file, differences) measured with another
    configuration than the current one: never relabelled."""
    if not stale:
        return
    shown = "; ".join(f"cell {cell} ({', '.join(diff[:3])})" for cell, _, diff in stale[:3])
    more = f" (+{len(stale) - 3} more cells)" if len(stale) > 3 else ""
    files = " ".join(path for _, path, _ in stale)
    raise CellFailed(
        f"{len(stale)} raw record(s) were measured with another configuration than the current "
        f"one: {shown}{more}; restore the configuration, or delete them to rerun: rm {files}"
    )
