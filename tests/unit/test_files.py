"""Tests of servesweep.core.files: a failed write leaves nothing under the final name."""

from pathlib import Path

import pytest

from servesweep.core.files import atomic_open, current_umask, write_json_atomic, write_text_atomic


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


def test_files_follow_the_umask_and_only_asked_for_modes_are_private(tmp_path: Path) -> None:
    import os
    import stat

    old = os.umask(0o022)
    try:
        assert current_umask() == 0o022
        write_text_atomic(tmp_path / "results.csv", "a\n")
        assert stat.S_IMODE((tmp_path / "results.csv").stat().st_mode) == 0o644
        os.umask(0o002)
        write_text_atomic(tmp_path / "summary.json", "{}\n")
        assert stat.S_IMODE((tmp_path / "summary.json").stat().st_mode) == 0o664
        with atomic_open(tmp_path / "secret", perms=0o600) as fh:
            fh.write("x")
        assert stat.S_IMODE((tmp_path / "secret").stat().st_mode) == 0o600
    finally:
        os.umask(old)
