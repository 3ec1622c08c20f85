"""The builtin client's self-check: its CPU time, event-loop lag and GC pauses while measuring."""

from __future__ import annotations

import asyncio
import gc
import math
import time
from collections.abc import Mapping
from typing import Any

from servesweep.measure.loadgen.usage import CPU_PCT_COLUMN

# How often the lag probe wakes up; its lag is how late each wake-up came.
PROBE_INTERVAL_S = 0.01
# Record keys the self-check adds (the builtin's record; bench_serving has none of them).
SELFCHECK_KEYS = (
    "client_wall_s",
    "client_cpu_s",
    "client_cpu_pct",
    "client_loop_lag_p99_ms",
    "client_loop_lag_max_ms",
    "client_gc_pause_ms",
    "client_gc_pause_max_ms",
)


def _percentile(values: list[float], q: float) -> float:
    """numpy's linear percentile without numpy (NaN for no value)."""
    if not values:
        return math.nan
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


class SelfCheck:
    """Started right before the measured requests and stopped right after them, in the
    client's event loop: process CPU time, a probe task's wake-up lag, gc callbacks' pauses."""

    def __init__(self, *, interval_s: float = PROBE_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.lags: list[float] = []
        self.gc_pauses: list[float] = []
        self._gc_start = 0.0
        self._task: asyncio.Task[None] | None = None
        self._wall0 = self._cpu0 = 0.0

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
        elif self._gc_start:
            self.gc_pauses.append(time.perf_counter() - self._gc_start)
            self._gc_start = 0.0

    async def _probe(self) -> None:
        clock = time.perf_counter
        while True:
            due = clock() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self.lags.append(max(0.0, clock() - due))

    def start(self) -> None:
        gc.callbacks.append(self._gc)
        self._wall0, self._cpu0 = time.perf_counter(), time.process_time()
        self._task = asyncio.get_running_loop().create_task(self._probe())

    def stop(self) -> dict[str, float]:
        """The SELFCHECK_KEYS figures over the time since start."""
        wall = time.perf_counter() - self._wall0
        cpu = time.process_time() - self._cpu0
        if self._task is not None:
            self._task.cancel()
        if self._gc in gc.callbacks:
            gc.callbacks.remove(self._gc)
        lags_ms = [x * 1000.0 for x in self.lags]
        return {
            "client_wall_s": wall,
            "client_cpu_s": cpu,
            "client_cpu_pct": 100.0 * cpu / wall if wall > 0 else math.nan,
            "client_loop_lag_p99_ms": _percentile(lags_ms, 99.0),
            "client_loop_lag_max_ms": max(lags_ms) if lags_ms else math.nan,
            "client_gc_pause_ms": 1000.0 * math.fsum(self.gc_pauses),
            "client_gc_pause_max_ms": 1000.0 * max(self.gc_pauses, default=0.0),
        }


def has_selfcheck(figures: Mapping[str, Any]) -> bool:
    """Whether `figures` hold the builtin's in-window self-check."""
    lag = float(figures.get("client_loop_lag_p99_ms", math.nan))
    cpu = float(figures.get("client_cpu_pct", math.nan))
    return not (math.isnan(lag) and math.isnan(cpu))


def saturated(figures: Mapping[str, Any], *, loop_lag_p99_ms: float, cpu_pct: float) -> bool | None:
    """Whether a client was saturated (config client.saturation): with the builtin's self-check,
    its in-window lag p99 or CPU above a limit; without one (bench_serving), the whole-process
    CPU measured from outside (CPU_PCT_COLUMN) at or above `cpu_pct`. That figure also
    covers the start-up (imports, tokenizer load, prompt generation), which is mostly CPU-bound
    too: a process that busy on average was CPU-bound while measuring as well, and a saturated
    window is not averaged away unless the start-up idled; a long start-up may flag a window
    just under the limit (docs/energy.md). None without either figure."""
    if has_selfcheck(figures):
        lag = float(figures.get("client_loop_lag_p99_ms", math.nan))
        cpu = float(figures.get("client_cpu_pct", math.nan))
        return bool(lag > loop_lag_p99_ms or cpu > cpu_pct)
    process = float(figures.get(CPU_PCT_COLUMN, math.nan))
    return None if math.isnan(process) else bool(process >= cpu_pct)
