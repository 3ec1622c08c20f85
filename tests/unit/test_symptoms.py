"""Seed 003's fixed-delay symptom (sglang#34815) read from results.csv rows."""

from __future__ import annotations

import pandas as pd

from servesweep.analysis import symptoms

# seed 003's validated table at concurrency 1 (config/reference/seed003_pd_standard.yaml)
HEALTHY = {
    "64-8-c1": (64, 1217.0),
    "1k-16-c1-nonstream": (1024, 1956.0),
    "16k-1-c1": (16384, 7565.0),
}


def _rows(cases: dict[str, tuple[int, float]], c8_ttft: float = 20555.0) -> pd.DataFrame:
    rows = [
        {"case": name, "ttft_p50_ms": ttft, "total_input_tokens": n, "completed": 1,
         "concurrency_mean": 1.0}
        for name, (n, ttft) in cases.items()
    ]  # fmt: skip
    rows.append(
        {"case": "16k-1-c8", "ttft_p50_ms": c8_ttft, "total_input_tokens": 40 * 16384,
         "completed": 40, "concurrency_mean": 7.9}
    )  # fmt: skip
    return pd.DataFrame(rows)


def test_the_seeds_healthy_table_has_no_fixed_delay() -> None:
    found = symptoms.fixed_delay(_rows(HEALTHY))
    assert found is not None and not found["suspected"]
    assert found["smallest_case"] == "64-8-c1" and found["largest_case"] == "16k-1-c1"
    assert found["share"] == round(1217 / 7565, 3) and "advice" not in found


def test_a_floor_that_does_not_move_with_the_prompt_is_flagged_with_the_control() -> None:
    stuck = {name: (n, 7000.0 + n / 100) for name, (n, _) in HEALTHY.items()}
    found = symptoms.fixed_delay(_rows(stuck))
    assert found["suspected"]
    assert found["cases_at_floor"] == ["16k-1-c1", "1k-16-c1-nonstream"]  # 16x and 256x longer
    assert "sglang#34815" in found["advice"] and symptoms.CONTROL in found["advice"]


def test_no_verdict_without_cases_far_enough_apart() -> None:
    assert symptoms.fixed_delay(_rows({"a": (1000, 10.0), "b": (2000, 11.0)})) is None
    assert symptoms.fixed_delay(pd.DataFrame({"x": [1]})) is None
