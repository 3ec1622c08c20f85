"""Multi-node simulator: three real rank processes rendezvous over loopback TCP."""

from __future__ import annotations

import signal
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.support.simprocess import SimProcess, free_port, start_sim

FAST = ["--model", "sim/m", "--sim-time-scale", "0.001", "--sim-startup-s", "1"]
TOPO = ["--tp-size", "24", "--ep-size", "24", "--nnodes", "3"]


def health(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/health", timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


class Cluster:
    """Starts ranks of one simulated server on loopback."""

    def __init__(self, stack: ExitStack, tmp: Path) -> None:
        self.stack, self.tmp = stack, tmp
        self.http_port, self.dist_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"

    def rank(self, r: int, *extra: str) -> SimProcess:
        argv = [
            *FAST,
            *TOPO,
            "--node-rank",
            str(r),
            "--port",
            str(self.http_port),
            "--dist-init-addr",
            f"127.0.0.1:{self.dist_port}",
            *extra,
        ]
        return self.stack.enter_context(start_sim(argv=argv, log_path=self.tmp / f"r{r}.log"))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with ExitStack() as stack:
        yield Cluster(stack, tmp_path)


def test_rank0_is_healthy_only_after_all_ranks_joined_and_dies_when_one_is_killed(
    cluster: Cluster,
) -> None:
    r0 = cluster.rank(0)
    r0.wait_for_line("Uvicorn running on")
    assert health(cluster.url) == 503
    r1 = cluster.rank(1)
    r0.wait_for_line("node_rank 1 joined")
    r1.wait_for_line("Capture cuda graph end.")
    assert health(cluster.url) == 503
    assert "fired up" not in r0.log()
    r2 = cluster.rank(2)
    r0.wait_ready()
    assert health(cluster.url) == 200
    for peer in (r1, r2):
        # A peer logs its join once rank 0 answered the handshake: rank 0 may be ready first.
        peer.wait_for_line("Joined node_rank 0")
        assert "Uvicorn running" not in peer.log() and "fired up" not in peer.log()

    r2.proc.send_signal(signal.SIGKILL)
    assert r0.wait_exit() != 0
    log0 = r0.log()
    assert "NCCL error: remote process exited or there was a network error" in log0
    assert "Scheduler hit an exception:" in log0 and "node_rank 2" in log0
    assert r1.wait_exit() != 0  # rank 0 vanished without saying goodbye
    assert "NCCL error" in r1.log() and "Scheduler hit an exception:" in r1.log()


def test_sigterm_is_a_graceful_exit_0_on_every_rank(cluster: Cluster) -> None:
    ranks = [cluster.rank(r) for r in range(3)]
    ranks[0].wait_ready()
    assert ranks[1].stop() == 0  # a rank leaving on purpose takes rank 0 down cleanly
    assert ranks[0].wait_exit() == 0
    assert ranks[2].wait_exit() == 0
    for r in ranks:
        assert "Scheduler hit an exception" not in r.log() and "NCCL error" not in r.log()


def test_sigterm_on_rank0_ends_the_others_cleanly(cluster: Cluster) -> None:
    ranks = [cluster.rank(r) for r in range(3)]
    ranks[0].wait_ready()
    assert ranks[0].stop() == 0
    assert [r.wait_exit() for r in ranks[1:]] == [0, 0]
    assert "node_rank 0 shut down" in ranks[1].log()


def test_a_rank_started_first_waits_for_rank0(cluster: Cluster) -> None:
    r2 = cluster.rank(2)
    r1 = cluster.rank(1)
    r2.wait_for_line("joining")
    r0 = cluster.rank(0)
    r0.wait_ready()
    assert health(cluster.url) == 200
    assert r1.proc.poll() is None and r2.proc.poll() is None


def test_rank_gives_up_when_rank0_never_comes(cluster: Cluster) -> None:
    r1 = cluster.rank(1, "--dist-timeout", "1")
    assert r1.wait_exit() == 1
    log = r1.log()
    assert "Scheduler hit an exception:" in log and "timed out" in log


def test_rank0_gives_up_when_a_rank_never_joins(cluster: Cluster) -> None:
    r0 = cluster.rank(0, "--dist-timeout", "1")
    cluster.rank(1)
    assert r0.wait_exit() == 1
    assert "node_rank(s) [2]" in r0.log()
