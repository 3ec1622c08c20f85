"""Run a client module, measuring the CPU, wall and GC time of its event loop (asyncio.run).

Usage: python benchmarks/_probe.py OUT.json MODULE [ARGS...]

Both clients (the builtin and SGLang's bench_serving) run their whole benchmark (ready check,
warmup, the requests, metrics) inside one `asyncio.run`; this wraps it, so interpreter start,
imports and (for bench_serving) dataset sampling before the loop are not counted. One JSON line
per `asyncio.run` call is appended to OUT.json.
"""

from __future__ import annotations

import asyncio
import gc
import json
import runpy
import sys
import time
from typing import Any

_gc_started: list[float] = []
_gc_pauses: list[tuple[int, float]] = []  # (generation, seconds)


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _gc_started.append(time.perf_counter())
    elif _gc_started:
        _gc_pauses.append((int(info["generation"]), time.perf_counter() - _gc_started.pop()))


def _wrap(original: Any, out: str) -> Any:
    def run(main: Any, **kwargs: Any) -> Any:
        _gc_pauses.clear()
        gc.callbacks.append(_on_gc)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        try:
            return original(main, **kwargs)
        finally:
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            gc.callbacks.remove(_on_gc)
            pauses = [s for _, s in _gc_pauses]
            line = {
                "cpu_s": cpu,
                "wall_s": wall,
                "gc_s": sum(pauses),
                "gc_max_pause_ms": 1000 * max(pauses, default=0.0),
                "gc_collections": [sum(1 for g, _ in _gc_pauses if g == n) for n in range(3)],
                "gc_full_s": sum(s for g, s in _gc_pauses if g == 2),
            }
            with open(out, "a") as fh:
                fh.write(json.dumps(line) + "\n")

    return run


def main() -> None:
    out, module, *args = sys.argv[1:]
    asyncio.run = _wrap(asyncio.run, out)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
