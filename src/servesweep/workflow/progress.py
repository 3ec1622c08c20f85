"""The matrix's progress on the console: one line per finished cell-repeat (i/N, the cell, its
key figures, elapsed time, ETA), counted against the cell-repeats missing at the run's start."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path

from servesweep.core.files import write_json_atomic

log = logging.getLogger(__name__)


def start(*, path: str | Path, planned: Sequence[str | Path], now: float | None = None) -> None:
    """At the run's start (`onstart`): the raw files this run has to write, and the time."""
    write_json_atomic(
        path,
        {"started_at": time.time() if now is None else now, "planned": [str(p) for p in planned]},
    )


def duration_text(seconds: float) -> str:
    """`41s`, `2m05s`, `1h02m`."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _figure(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{text} {unit}"


def cell_line(
    *,
    cell: str,
    ttft_p50_ms: float | None,
    input_tps: float | None,
    done: int,
    total: int,
    elapsed_s: float,
) -> str:
    """`[ 3/24] <cell>  TTFT p50 628 ms  input 5,210 tok/s  elapsed 41s  ETA 2m05s`: the ETA
    from the mean time per finished cell-repeat so far."""
    total = max(total, done)
    eta = elapsed_s / done * (total - done) if done else None
    width = len(str(total))
    return (
        f"[{done:>{width}}/{total}] {cell}  TTFT p50 {_figure(ttft_p50_ms, 'ms')}  "
        f"input {_figure(input_tps, 'tok/s')}  elapsed {duration_text(elapsed_s)}  "
        f"ETA {'?' if eta is None else duration_text(eta)}"
    )


def finished_line(
    *, path: str | Path, cell: str, raw: str | Path, now: float | None = None
) -> str | None:
    """The console line of a cell-repeat whose raw record `raw` was just written, from the
    run's progress file (`path`, written by `start`); None without one (a job run alone)."""
    from servesweep.measure.records import read_record

    progress = Path(path)
    if not progress.exists():
        return None
    state = json.loads(progress.read_text())
    planned = [Path(p) for p in state.get("planned") or []]
    done = sum(p.exists() for p in planned) + (Path(raw) not in planned)
    record = read_record(raw, keys=("median_ttft_ms", "input_throughput"))
    return cell_line(
        cell=cell,
        ttft_p50_ms=record.median_ttft_ms,
        input_tps=record.input_throughput,
        done=done,
        total=len(planned),
        elapsed_s=(time.time() if now is None else now) - float(state["started_at"]),
    )
