"""The telemetry query's sampling loop, recorded on a real H200 beside a real load
(tests/data/nvidia-smi-loop, made by benchmarks/gpu_capture.py): power and SM utilisation rise
with the load and fall after it, as the parser reads them."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from statistics import mean

from servesweep.telemetry import parse_noheader

DATA = Path(__file__).resolve().parents[1] / "data" / "nvidia-smi-loop"


def samples() -> list[tuple[datetime, dict]]:
    rows = parse_noheader((DATA / "loop-noheader-nounits.csv").read_text())
    return [(datetime.strptime(r["timestamp"], "%Y/%m/%d %H:%M:%S.%f"), r) for r in rows]


def phase(name: str) -> datetime:
    stamp = json.loads((DATA / "phases.json").read_text())[name]
    return datetime.fromisoformat(stamp).replace(tzinfo=None)


def test_one_sample_a_second_for_the_whole_capture():
    times = [t for t, _ in samples()]
    gaps = [(b - a).total_seconds() for a, b in zip(times, times[1:], strict=False)]
    assert len(times) >= 50 and all(0.9 < g < 1.2 for g in gaps)


def test_power_and_sm_utilisation_rise_and_fall_with_the_load():
    start, end = phase("load_started"), phase("load_ended")
    rows = samples()
    before = [r for t, r in rows if t < start]
    # the first seconds of the load are torch's start-up (allocation, random fill), not matmuls
    during = [r for t, r in rows if (t - start).total_seconds() > 6 and t < end]
    after = [r for t, r in rows if (t - end).total_seconds() > 2]
    assert len(before) >= 8 and len(during) >= 20 and len(after) >= 5

    def avg(group: list[dict], key: str) -> float:
        return mean(r[key] for r in group)

    assert avg(before, "utilization_gpu_pct") == 0
    assert avg(during, "utilization_gpu_pct") > 90
    assert avg(after, "utilization_gpu_pct") == 0
    assert avg(during, "power_draw_w") > 5 * avg(before, "power_draw_w")
    assert avg(after, "power_draw_w") < 0.5 * avg(during, "power_draw_w")
    assert max(r["memory_used_mib"] for _, r in rows) > avg(before, "memory_used_mib")
