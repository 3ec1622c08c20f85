"""core.parallel: chunks mapped in forked processes, joined in order, errors brought back."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys

import pytest

from servesweep.core import parallel
from servesweep.core.errors import CellFailed, WorkerDied
from tests.helpers import REPO

WAIT_S = 30.0  # bound of the workers' wait for each other below (not a timed assert)


def _pids_and_squares(chunk):
    return [(os.getpid(), x * x) for x in chunk]


def test_chunks_run_in_other_processes_and_come_back_in_order():
    # How many workers take chunks is up to the scheduler: on a loaded machine the first
    # forked worker can drain the queue before the next one starts (seen: one pid of three).
    # So the first two chunks to start meet at a barrier: each waits in its worker until the
    # other has started, which only a second worker process can do (a pool that ran every chunk
    # in one process would break the barrier after WAIT_S and raise here). The barrier and the
    # counter reach the workers by fork, as map_chunks' closures do.
    ctx = multiprocessing.get_context("fork")
    started, meet = ctx.Value("i", 0), ctx.Barrier(2, timeout=WAIT_S)

    def pids_and_squares_after_meeting(chunk):
        with started.get_lock():
            started.value += 1
            nth = started.value
        if nth <= 2:
            meet.wait()
        return _pids_and_squares(chunk)

    items = list(range(1000))
    out = parallel.map_chunks(pids_and_squares_after_meeting, items, workers=3, min_per_worker=10)
    assert [sq for _, sq in out] == [x * x for x in items]
    pids = {pid for pid, _ in out}
    assert os.getpid() not in pids
    assert 2 <= len(pids) <= 3  # two met at the barrier; never more than `workers`


def test_a_closure_over_unpicklable_state_reaches_the_workers():
    lock_free_state = {"offset": 7, "gen": (x for x in ())}  # a generator cannot be pickled
    out = parallel.map_chunks(
        lambda chunk: [x + lock_free_state["offset"] for x in chunk],
        range(200),
        workers=2,
        min_per_worker=10,
    )
    assert out == [x + 7 for x in range(200)]


@pytest.mark.parametrize(("workers", "n"), [(1, 1000), (8, 100)])
def test_one_process_when_one_worker_or_too_few_items(workers, n):
    out = parallel.map_chunks(_pids_and_squares, list(range(n)), workers=workers)
    assert {pid for pid, _ in out} == {os.getpid()}


def test_a_worker_error_is_raised_in_the_caller():
    def fail_on_13(chunk):
        if 13 in chunk:
            raise CellFailed("cell 13: record refused")
        return list(chunk)

    with pytest.raises(CellFailed, match="cell 13: record refused"):
        parallel.map_chunks(fail_on_13, list(range(100)), workers=2, min_per_worker=10)
    assert parallel._WORK is None  # the next map starts clean


def _die_on_13(chunk):
    if 13 in chunk:  # as the OOM killer ends a worker: no handler, no answer
        os.kill(os.getpid(), signal.SIGKILL)
    return list(chunk)


def test_a_killed_worker_is_one_error_naming_it():
    with pytest.raises(WorkerDied) as caught:
        parallel.map_chunks(
            _die_on_13, list(range(100)), workers=2, min_per_worker=10, what="reading records"
        )
    text = str(caught.value)
    assert "a worker process reading records died" in text and "rerun" in text
    assert "\n" not in text and caught.value.__cause__ is None
    assert parallel._WORK is None


def test_a_job_whose_worker_is_killed_ends_in_one_line_without_a_traceback(tmp_path):
    code = (
        "from servesweep.core import parallel\n"
        "from servesweep.workflow.logsetup import job_logging\n"
        "from tests.unit.test_parallel import _die_on_13\n"
        f"with job_logging({str(tmp_path / 'job.log')!r}):\n"
        "    parallel.map_chunks(_die_on_13, list(range(100)), workers=2, min_per_worker=10,"
        " what='reading the raw records')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [
        "servesweep: WorkerDied: a worker process reading the raw records died (killed from "
        "outside: the OOM killer or `kill -9`); nothing was written: rerun the same command"
    ], proc.stderr


def test_usable_cores_follow_the_affinity():
    assert parallel.usable_cores() == len(os.sched_getaffinity(0)) >= 1
