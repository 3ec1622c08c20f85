"""Planning reads the raw folder once: RunPaths.raw_files, and the records' own copy of their
configuration compared only where a record is (workflow.lostmetadata, workflow.plan)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from servesweep.config.load import load_experiment_file
from servesweep.config.matrix import cell_repeats
from servesweep.config.paths import RunPaths
from servesweep.measure.provenance import KEY, measured_with
from servesweep.workflow.lostmetadata import changed_without_metadata
from servesweep.workflow.plan import MISSING, rerun_reason
from tests.helpers import DEFAULT_CONFIG


def test_raw_files_lists_the_records_as_raw_names_them_without_superseded(tmp_path: Path):
    exp = load_experiment_file(DEFAULT_CONFIG)
    paths = RunPaths(tmp_path / exp.run_id)
    assert paths.raw_files() == set()
    cells = cell_repeats(exp)
    for cell in cells[:3]:
        paths.raw(cell).parent.mkdir(parents=True, exist_ok=True)
        paths.raw(cell).write_text(json.dumps({KEY: measured_with(exp, cell)}) + "\n")
    kept = paths.root / "raw" / ".superseded" / "t" / "raw" / f"{cells[4].key}.jsonl"
    kept.parent.mkdir(parents=True)
    kept.write_text("{}\n")
    assert paths.raw_files() == {str(paths.raw(c)) for c in cells[:3]}
    listed = paths.raw_files()
    assert [rerun_reason(exp, paths, c, present=listed) for c in cells[2:4]] == [None, MISSING]


def test_a_fresh_run_reads_no_cell_and_a_changed_record_gets_its_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """No raw file: no per-cell stat at all (10k cells plan without 10k calls); a record
    measured with another workload, whose metadata Snakemake lost, gets its marker."""
    exp = load_experiment_file(DEFAULT_CONFIG)
    paths = RunPaths(tmp_path / exp.run_id)
    cells = cell_repeats(exp)
    metadata = tmp_path / "metadata"
    metadata.mkdir()
    calls = []
    real_exists = Path.exists
    monkeypatch.setattr(Path, "exists", lambda p: calls.append(p) or real_exists(p))
    assert changed_without_metadata(exp=exp, paths=paths, cells=cells, metadata_dir=metadata) == {}
    assert calls == []
    monkeypatch.undo()
    edited = exp.model_copy(
        update={"workload": exp.workload.model_copy(update={"num_requests": 7})}
    )
    raw = paths.raw(cells[0])
    raw.parent.mkdir(parents=True)
    raw.write_text(json.dumps({KEY: measured_with(exp, cells[0])}) + "\n")
    os.utime(raw, (1, 1))
    again = cell_repeats(edited)
    found = changed_without_metadata(exp=edited, paths=paths, cells=again, metadata_dir=metadata)
    assert list(found) == [cells[0].key]
    assert Path(found[cells[0].key]).stat().st_mtime > raw.stat().st_mtime
