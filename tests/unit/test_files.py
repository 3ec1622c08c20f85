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


def test_a_planted_shared_folder_or_link_is_refused_never_written_through(tmp_path, monkeypatch):
    """The Slurm head-side folder (issue 40, high): another user pre-creates
    /tmp/servesweep-slurm-<uid> 0777 with a link named after a step; root must not write the
    link's target, nor take a lock there."""
    import os

    from servesweep.cluster import slurm
    from servesweep.core.errors import TransportError
    from servesweep.core.files import open_private, private_dir

    monkeypatch.setattr(slurm, "LOCK_DIR", str(tmp_path))
    mine = private_dir(tmp_path / "fresh")
    assert (mine.stat().st_mode & 0o777) == 0o700
    planted = slurm.head_dir()
    planted.mkdir()
    planted.chmod(0o777)
    target = tmp_path / "victim"
    (planted / "step.srun.log").symlink_to(target)
    with pytest.raises(OSError, match="not a private folder"):
        private_dir(planted)
    with pytest.raises(TransportError, match="not a private folder"), slurm._head_lock("alloc"):
        pass
    if os.geteuid() == 0:  # as root (CI): a folder of another owner, mode 0700 or not
        planted.chmod(0o700)
        os.chown(planted, 12345, 12345)
        with pytest.raises(OSError, match="owned by uid 12345"):
            private_dir(planted)
        os.chown(planted, os.geteuid(), os.getegid())
    planted.chmod(0o700)
    with pytest.raises(OSError):  # our own folder, but the name is a planted link: ELOOP
        open_private(private_dir(planted) / "step.srun.log")
    assert not target.exists()
    os.rmdir(tmp_path / "fresh")
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(OSError, match="not a folder of ours"):
        private_dir(link)
