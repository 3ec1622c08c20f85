"""Tests of servesweep.files: a failed write leaves nothing under the final name."""

from pathlib import Path

import pytest

from servesweep.files import atomic_open, write_json_atomic


def test_failed_write_leaves_no_file(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "r1.jsonl"
    with pytest.raises(RuntimeError), atomic_open(target) as fh:
        fh.write("half a record")
        raise RuntimeError("disk full")
    assert not target.exists()
    assert list(target.parent.iterdir()) == []


def test_successful_write_replaces(tmp_path: Path) -> None:
    target = tmp_path / "s.json"
    target.write_text("old")
    write_json_atomic(target, {"a": 1})
    assert target.read_text() == '{\n  "a": 1\n}\n'
