"""Seed 003's reference table: loading, and each case's delta marked outside the tolerance."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from servesweep.analysis.reference import load_reference, reference_table
from servesweep.config.load import load_experiment_file
from servesweep.config.matrix import client_specs
from servesweep.core.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
PD = ROOT / "config" / "experiments" / "pd_standard.yaml"


def test_the_seed_table_is_the_reference_of_both_pd_configs() -> None:
    for name in ("pd_standard.yaml", "pd_standard_local.yaml"):
        exp = load_experiment_file(ROOT / "config" / "experiments" / name)
        assert exp.reference is not None
        ref = load_reference(ROOT / exp.reference.file, cases=list(exp.cases))
        assert set(ref.cases) == set(exp.cases)
    assert ref.cases["16k-1-c8"].ttft_p95_s == 21.345
    assert ref.cases["1k-16-c1-nonstream"].tpot_p50_ms is None


def test_deltas_are_marked_outside_the_tolerance(tmp_path: Path) -> None:
    exp = load_experiment_file(PD)
    clients = client_specs(exp)
    ref = load_reference(
        ROOT / "config" / "reference" / "seed003_pd_standard.yaml", cases=list(exp.cases)
    )
    results = pd.DataFrame(
        [
            # 64-8-c1: TTFT +2.7% (inside 10%), TPS -20% (outside)
            {
                "client_id": "case~64-8-c1",
                "input_tps": 33.744,
                "ttft_p50_ms": 1250,
                "ttft_p95_ms": 1250,
            },
            # 16k-1-c8: TTFT P50 +20% (outside), P95 exact
            {
                "client_id": "case~16k-1-c8",
                "input_tps": 6364.31,
                "ttft_p50_ms": 24666,
                "ttft_p95_ms": 21345,
            },
        ]
    )
    table = reference_table(results=results, clients=clients, reference=ref, tolerance=0.10)
    rows = {r["Case"]: r for r in table.to_dict("records")}
    assert set(rows) == {"64-8-c1", "16k-1-c8"}  # only cases that ran
    assert rows["64-8-c1"]["Delta P50 / P95"] == "+2.7% / +2.7%"
    assert rows["64-8-c1"]["Delta TPS"] == "**-20.0%**"
    assert rows["16k-1-c8"]["Delta P50 / P95"] == "**+20.0%** / +0.0%"
    assert rows["16k-1-c8"]["Reference"] == "20.555 / 21.345 s"
    assert rows["16k-1-c8"]["TPOT P50 / P95"] == "N/A"  # one output token, no TPOT
    assert rows["16k-1-c8"]["Delta TPOT P50 / P95"] == "N/A"
    # The sim's wall-clock figures are compared in simulated units
    scaled = results.assign(
        ttft_p50_ms=results["ttft_p50_ms"] * 0.05,
        ttft_p95_ms=results["ttft_p95_ms"] * 0.05,
        input_tps=results["input_tps"] / 0.05,
    )
    again = reference_table(
        results=scaled, clients=clients, reference=ref, tolerance=0.10, time_factor=1 / 0.05
    )
    assert again.equals(table)


def test_the_reference_table_has_tpot_beside_the_reference(tmp_path: Path) -> None:
    """Issue 27: the PD answer is this table, with TTFT and TPOT (ms, like the case table)."""
    exp = load_experiment_file(PD, {"SUITE": "all"})
    ref = load_reference(
        ROOT / "config" / "reference" / "seed003_pd_standard.yaml", cases=list(exp.cases)
    )
    results = pd.DataFrame(
        [
            {
                "client_id": "case~16k-512-c8",
                "input_tps": 2544.27,
                "ttft_p50_ms": 18755,
                "ttft_p95_ms": 23182,
                "tpot_p50_ms": 69.52,  # +10.0% (inside 10%)
                "tpot_p95_ms": 79.86,  # +20.0%
            }
        ]
    )
    table = reference_table(
        results=results, clients=client_specs(exp), reference=ref, tolerance=0.10
    )
    row = table.to_dict("records")[0]
    assert row["TPOT P50 / P95"] == "69.52 / 79.86 ms"
    assert row["Reference TPOT"] == "63.20 / 66.55 ms"
    assert row["Delta TPOT P50 / P95"] == "+10.0% / **+20.0%**"


def test_a_bad_reference_file_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "ref.yaml"
    bad.write_text(
        "source: x\ncases:\n"
        "  no-such-case: {requests: 1, input_tps: 1, ttft_p50_s: 1, ttft_p95_s: 1}\n"
    )
    with pytest.raises(
        ConfigError,
        match=r"^config key 'reference.file': .* \['no-such-case'\] that are not in cases$",
    ):
        load_reference(bad, cases=["64-8-c1"])
    with pytest.raises(ConfigError, match="cannot read"):
        load_reference(tmp_path / "missing.yaml", cases=[])


def test_the_pp1_control_differs_from_pd_standard_only_in_prefill_parallelism() -> None:
    import json

    from servesweep.config.matrix import measured_config

    std = json.loads(measured_config(load_experiment_file(PD)))
    ctl = json.loads(measured_config(load_experiment_file(PD.with_name("pd_pp1_control.yaml"))))
    assert (
        ctl["roles"]["prefill"]["server"] | {"pp_size": 8, "tp_size": 4, "ep_size": 4}
        == (std["roles"]["prefill"]["server"])
    )
    assert ctl["roles"]["prefill"]["server"]["pp_size"] == 1
    assert ctl["roles"]["decode"] == std["roles"]["decode"]
    for key in ("run_id", "roles", "evidence"):
        std.pop(key), ctl.pop(key)
    assert ctl == std, "decode, router, image, cases and reference as in pd_standard"
