"""Tests of servesweep.analysis.casetable: the PD suite's case table from results.csv rows."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from servesweep.analysis.casetable import case_label, case_table, markdown_table
from servesweep.config.load import load_experiment_file
from servesweep.config.matrix import client_specs

PD_LOCAL = Path(__file__).resolve().parents[2] / "config" / "experiments" / "pd_standard_local.yaml"


def _rows(client_id: str, ttft_ms: list[float], tpot_ms: float) -> list[dict]:
    return [
        {
            "client_id": client_id,
            "input_tps": 1000.0 * (i + 1),
            "ttft_p50_ms": t,
            "ttft_p95_ms": 2 * t,
            "tpot_p50_ms": tpot_ms,
            "tpot_p95_ms": 2 * tpot_ms,
        }
        for i, t in enumerate(ttft_ms)
    ]


def test_case_table_medians_over_repeats_and_tpot_only_where_defined() -> None:
    clients = client_specs(load_experiment_file(PD_LOCAL, {}))
    one_token = next(c for c in clients if c.workload.output_len == 1)
    decode = next(c for c in clients if c.workload.output_len > 1 and c.workload.stream)
    results = pd.DataFrame(
        _rows(one_token.id, [100.0, 300.0, 200.0], 0.0) + _rows(decode.id, [50.0, 70.0], 4.0)
    )
    table = case_table(results=results, clients=clients).set_index("Case")
    shown = [case_label(c.workload) for c in clients if c in (one_token, decode)]
    assert list(table.index) == shown  # in the suite's order; cases without rows left out
    first = table.loc[case_label(one_token.workload)]
    assert first["TTFT P50 / P95"] == "0.200 / 0.400 s"  # medians of 3 repeats, in seconds
    assert first["Input TPS"] == "2000.00" and first["TPOT P50 / P95"] == "N/A"
    assert table.loc[case_label(decode.workload), "TPOT P50 / P95"] == "4.00 / 8.00 ms"
    assert first["Requests"] == one_token.workload.num_requests


def test_case_label_names_lengths_in_k_and_non_streaming() -> None:
    clients = client_specs(load_experiment_file(PD_LOCAL, {}))
    w = clients[0].workload
    assert case_label(w.model_copy(update={"input_len": 16384, "output_len": 512})).startswith(
        "16K -> 512, C"
    )
    assert case_label(w.model_copy(update={"stream": False})).endswith(", non-streaming")


def test_markdown_table_right_aligns_numbers() -> None:
    df = pd.DataFrame([{"Case": "a", "Requests": 3, "Input TPS": "1.00"}])
    assert markdown_table(df) == (
        "| Case | Requests | Input TPS |\n|---|---:|---:|\n| a | 3 | 1.00 |\n"
    )
