"""tests.support.simprocess: starting the sim behind a command prefix (CPU pinning)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.simprocess import start_sim

QUICK = ["--model", "m", "--port", "0", "--sim-time-scale", "0", "--skip-server-warmup"]


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset")
def test_prefix_pins_the_sim_whose_pid_is_the_sim_itself(tmp_path: Path) -> None:
    prefix = ["taskset", "-c", "0"]
    with start_sim(argv=QUICK, log_path=tmp_path / "pinned.log", prefix=prefix) as proc:
        proc.wait_ready()
        status = Path(f"/proc/{proc.pid}/status").read_text()
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
        assert proc.stop() == 0
    assert "Cpus_allowed_list:\t0\n" in status
    assert cmdline[1:3] == [b"-m", b"servesweep.sim"]  # taskset exec'd the sim
