"""One console line per finished cell-repeat (servesweep.workflow.progress)."""

from __future__ import annotations

from pathlib import Path

import pytest

from servesweep.measure.records import write_record
from servesweep.workflow import progress


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.4, "0s"), (41, "41s"), (125, "2m05s"), (3725, "1h02m")]
)
def test_durations(seconds, text):
    assert progress.duration_text(seconds) == text


def test_the_line_gives_i_of_n_the_cell_its_figures_elapsed_and_eta():
    line = progress.cell_line(
        cell="b~marlin/concurrency~8/r3", ttft_p50_ms=628.4, input_tps=207402.2,
        done=3, total=24, elapsed_s=30.0,
    )  # fmt: skip
    assert line == (
        "[ 3/24] b~marlin/concurrency~8/r3  TTFT p50 628 ms  input 207,402 tok/s  "
        "elapsed 30s  ETA 3m30s"
    )
    none = progress.cell_line(
        cell="c", ttft_p50_ms=None, input_tps=None, done=0, total=2, elapsed_s=1
    )
    assert "TTFT p50 n/a" in none and "ETA ?" in none


def test_finished_line_counts_the_planned_raw_files(tmp_path: Path):
    raws = [tmp_path / f"r{i}.jsonl" for i in (1, 2, 3, 4)]
    state = tmp_path / "logs" / "progress.json"
    assert progress.finished_line(path=state, cell="c", raw=raws[0]) is None  # no run started
    progress.start(path=state, planned=raws, now=1000.0)
    for raw in raws[:2]:
        write_record(raw, {"median_ttft_ms": 12.5, "input_throughput": 99.0})
    line = progress.finished_line(path=state, cell="c/r2", raw=raws[1], now=1010.0)
    assert line == "[2/4] c/r2  TTFT p50 12.5 ms  input 99 tok/s  elapsed 10s  ETA 10s"
    # a cell rerun on purpose (-f: its raw file existed at the start) still counts
    forced = tmp_path / "forced.jsonl"
    write_record(forced, {"median_ttft_ms": 1.0})
    assert progress.finished_line(path=state, cell="f", raw=forced, now=1012.0).startswith(
        "[3/4] f"
    )
