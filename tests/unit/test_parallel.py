"""core.parallel: chunks mapped in forked processes, joined in order, errors brought back."""

from __future__ import annotations

import os

import pytest

from servesweep.core import parallel
from servesweep.core.errors import CellFailed


def _pids_and_squares(chunk):
    return [(os.getpid(), x * x) for x in chunk]


def test_chunks_run_in_other_processes_and_come_back_in_order():
    items = list(range(1000))
    out = parallel.map_chunks(_pids_and_squares, items, workers=3, min_per_worker=10)
    assert [sq for _, sq in out] == [x * x for x in items]
    pids = {pid for pid, _ in out}
    assert os.getpid() not in pids
    assert 2 <= len(pids) <= 3


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


def test_usable_cores_follow_the_affinity():
    assert parallel.usable_cores() == len(os.sched_getaffinity(0)) >= 1
