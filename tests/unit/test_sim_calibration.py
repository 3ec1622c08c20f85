"""Seed 003 replayed offline: every case within 15% of the seed's TTFT P50 and input TPS."""

from __future__ import annotations

import dataclasses

import pytest

from servesweep.sim.calibration import (
    SEED_003_CASES,
    SEED_COLD_TTFT_S,
    TOLERANCE,
    CaseResult,
    cold_start_ttft,
    format_table,
    run_calibration,
    run_case,
)
from servesweep.sim.costmodel import CostModel
from servesweep.sim.profiles import (
    DEFAULT_PROFILE,
    KIMI_K3_PD_PROFILE,
    PROFILES,
    SimProfile,
    get_profile,
)


@pytest.fixture(scope="module")
def results() -> dict[str, CaseResult]:
    return {r.case.name: r for r in run_calibration()}


@pytest.mark.parametrize("name", [c.name for c in SEED_003_CASES])
def test_case_is_within_15_percent_of_the_seed(results: dict[str, CaseResult], name: str) -> None:
    r = results[name]
    assert abs(r.ttft_error) <= TOLERANCE, (name, r.ttft_p50_s, r.case.seed_ttft_p50_s)
    assert abs(r.tps_error) <= TOLERANCE, (name, r.input_tps, r.case.seed_input_tps)


def test_the_first_request_after_start_pays_the_rdma_warm_up(
    results: dict[str, CaseResult],
) -> None:
    cold = cold_start_ttft()
    assert abs(cold / SEED_COLD_TTFT_S - 1) <= TOLERANCE
    assert cold > results["64->8 C1"].ttft_p50_s + 3.0


def test_concurrency_and_decode_length_shape_the_results(
    results: dict[str, CaseResult],
) -> None:
    c1, c8 = results["16K->1 C1"], results["16K->1 C8"]
    assert c8.input_tps > 2 * c1.input_tps  # pipeline + transfer overlap
    assert c8.ttft_p50_s > 2 * c1.ttft_p50_s  # queueing at the shared link
    d1, d8 = results["16K->512 C1"], results["16K->512 C8"]
    assert d1.tpot_p50_ms is not None and d8.tpot_p50_ms is not None
    assert d8.tpot_p50_ms > 1.3 * d1.tpot_p50_ms  # bigger decode batches


def test_a_miscalibrated_profile_fails_the_check() -> None:
    good = get_profile(KIMI_K3_PD_PROFILE)
    slow_link = dataclasses.replace(
        good, transfer=dataclasses.replace(good.transfer, gbps_per_device=1.0)
    )
    r = run_case(case=SEED_003_CASES[3], profile=slow_link)
    assert not r.within_tolerance


def test_table_lists_every_case_next_to_the_seed(results: dict[str, CaseResult]) -> None:
    table = format_table(list(results.values()))
    assert table.count("\n") == len(SEED_003_CASES) + 1
    assert "| 16K->512 C8 | " in table and "/ 18.755 |" in table


def test_default_profile_is_the_unchanged_cost_model() -> None:
    assert get_profile(None).cost == CostModel() == get_profile(DEFAULT_PROFILE).cost
    assert not CostModel().pp_pipeline
    assert set(PROFILES) == {DEFAULT_PROFILE, KIMI_K3_PD_PROFILE}
    assert isinstance(get_profile(KIMI_K3_PD_PROFILE), SimProfile)
    with pytest.raises(ValueError, match="unknown simulator profile 'nope'"):
        get_profile("nope")
