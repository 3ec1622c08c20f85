"""tests.support.simprocess: starting the sim behind a command prefix (CPU pinning)."""

from __future__ import annotations

import json
import shutil
import urllib.request
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


def test_sims_with_reuse_port_share_one_port_and_both_serve(tmp_path: Path) -> None:
    """--sim-reuse-port (benchmarks/client.py --server-cores 1-4): a second sim binds the
    first one's port, and the kernel spreads fresh connections over both processes."""
    argv = [*QUICK, "--sim-reuse-port", "--enable-metrics"]
    with start_sim(argv=argv, log_path=tmp_path / "a.log") as first:
        url = first.wait_ready().url
        port = url.rsplit(":", 1)[1]
        second_argv = [*argv[:3], port, *argv[4:]]
        with start_sim(argv=second_argv, log_path=tmp_path / "b.log") as second:
            assert second.wait_ready().url == url
            body = json.dumps({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}})
            # Odd, so the two processes' counts cannot be equal: equal counts would collapse
            # into one value in `counts` (CI saw {20.0} when each served 20 of 40).
            sent = 41
            for _ in range(sent):  # urllib: one connection per request
                req = urllib.request.Request(f"{url}/generate", data=body.encode())
                with urllib.request.urlopen(req, timeout=10) as resp:
                    assert resp.status == 200
            counts = set()
            for _ in range(40):
                with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
                    text = resp.read().decode()
                counts |= {
                    float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines()
                    if line.startswith("sglang:num_requests_total")
                }
            assert second.stop() == 0
        assert first.stop() == 0
    # Each process counts what it served: two counts, both non-zero, together every request.
    assert len(counts) == 2 and 0 not in counts and sum(counts) == sent, counts
