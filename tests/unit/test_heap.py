"""Tests of workflow.heap: the tuned collector walks a growing heap of long-lived objects far
less often, and the call reports what it replaced."""

from __future__ import annotations

import gc

from servesweep.workflow.heap import THRESHOLDS, collect_less_often


def _full_collections_while_growing(objects: int) -> int:
    """Full collections while `objects` long-lived containers are built (Snakemake's DAG)."""
    full = 0

    def count(phase: str, info: dict) -> None:
        nonlocal full
        if phase == "start" and info["generation"] == 2:
            full += 1

    gc.collect()
    gc.freeze()  # the test process's own heap out of the way: a heap that starts empty
    gc.callbacks.append(count)
    try:
        kept = [[i] for i in range(objects)]  # lists: always tracked
    finally:
        gc.callbacks.remove(count)
        gc.unfreeze()
    assert len(kept) == objects
    return full


def test_a_growing_heap_gets_fewer_full_collections_than_with_the_defaults() -> None:
    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)  # CPython's defaults
        default = _full_collections_while_growing(1_000_000)
        assert collect_less_often() == (700, 10, 10)
        assert gc.get_threshold() == THRESHOLDS
        tuned = _full_collections_while_growing(1_000_000)
    finally:
        gc.set_threshold(*before)
    assert default >= 4, f"the defaults ran {default} full collections"
    assert tuned <= 1, f"tuned: {tuned} full collections (defaults: {default})"
