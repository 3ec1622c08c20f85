"""Tests of the builtin client's self-check: an injected event-loop block marks the cell
client-saturated, an unstarved loop does not."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest

from servesweep.config.schema import SaturationConfig
from servesweep.measure.loadgen.selfcheck import SELFCHECK_KEYS, SelfCheck, _percentile, saturated


def is_saturated(figures: dict, limits: SaturationConfig) -> bool | None:
    return saturated(figures, loop_lag_p99_ms=limits.loop_lag_p99_ms, cpu_pct=limits.cpu_pct)


async def _measure(*, block_s: float, every_s: float, total_s: float) -> dict[str, float]:
    check = SelfCheck()
    check.start()

    async def neighbour() -> None:  # the injected block: synchronous work in the event loop
        end = time.perf_counter() + total_s
        while time.perf_counter() < end:
            if block_s:
                time.sleep(block_s)
            await asyncio.sleep(every_s)

    await neighbour()
    return check.stop()


def test_injected_event_loop_block_marks_the_cell_saturated():
    starved = asyncio.run(_measure(block_s=0.03, every_s=0.005, total_s=0.6))
    assert set(starved) == set(SELFCHECK_KEYS)
    assert starved["client_loop_lag_p99_ms"] > 20
    assert starved["client_loop_lag_max_ms"] >= starved["client_loop_lag_p99_ms"]
    assert is_saturated(starved, SaturationConfig()) is True


def test_an_unstarved_loop_is_not_saturated():
    idle = asyncio.run(_measure(block_s=0.0, every_s=0.005, total_s=0.6))
    assert idle["client_cpu_pct"] < 90
    # a shared machine can delay one wake-up; p99 over ~60 probes stays well under 5 ms
    assert is_saturated(idle, SaturationConfig(loop_lag_p99_ms=25)) is False


def test_cpu_bound_client_and_gc_pauses():
    async def burn() -> dict[str, float]:
        check = SelfCheck()
        check.start()
        end = time.perf_counter() + 0.3
        junk = []
        while time.perf_counter() < end:
            junk.append([[] for _ in range(100)])
            if len(junk) > 200:
                junk.clear()
                gc.collect()
            await asyncio.sleep(0)
        return check.stop()

    got = asyncio.run(burn())
    # Against an idle loop measured alongside (a loaded machine gives the burner less than a
    # core, so no absolute share is asserted).
    idle = asyncio.run(_measure(block_s=0.0, every_s=0.01, total_s=0.3))
    assert got["client_cpu_pct"] > idle["client_cpu_pct"] + 15
    assert got["client_gc_pause_ms"] > 0 and got["client_gc_pause_max_ms"] > 0
    limit = SaturationConfig(cpu_pct=idle["client_cpu_pct"] + 10)
    assert is_saturated(got, limit) is True


def test_no_self_check_is_unknown_and_percentile():
    assert is_saturated({}, SaturationConfig()) is None
    assert _percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)


def test_without_a_self_check_the_whole_process_cpu_decides():
    limits = SaturationConfig(cpu_pct=90)
    assert is_saturated({"client_process_cpu_pct": 90.0}, limits) is True
    assert is_saturated({"client_process_cpu_pct": 89.9}, limits) is False
    # with a self-check, the window's figures decide
    window = {"client_cpu_pct": 20.0, "client_loop_lag_p99_ms": 1.0}
    assert is_saturated({**window, "client_process_cpu_pct": 99.0}, limits) is False
