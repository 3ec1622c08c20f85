"""Tests of servesweep.analysis.casetable: the PD suite's case table from results.csv rows."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from servesweep.analysis.casetable import (
    CaseTables,
    case_html,
    case_label,
    case_lines,
    case_markdown,
    case_table,
    case_tables,
    markdown_table,
)
from servesweep.config.load import load_experiment_file
from servesweep.config.matrix import client_specs

REPO = Path(__file__).resolve().parents[2]
PD_LOCAL = REPO / "config" / "experiments" / "pd_standard_local.yaml"


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


def _versus_run() -> CaseTables:
    """The local PD config's tables for rows 2x slower than seed 003's reference (each delta
    outside the tolerance)."""
    exp = load_experiment_file(PD_LOCAL, {})
    clients = client_specs(exp)
    scale = exp.engine.sim.time_scale
    rows = []
    for client in clients:
        rows += _rows(client.id, [1000.0 * scale, 1000.0 * scale], 10.0 * scale)
    reference = [REPO / exp.reference.file]
    return case_tables(exp=exp, results=pd.DataFrame(rows), reference=reference)


def test_bold_deltas_are_markdown_in_md_and_strong_in_html() -> None:
    tables = _versus_run()
    assert tables.versus is not None and not tables.versus.empty
    markdown = case_markdown(tables)
    assert "**" in markdown and "Against the reference" in markdown  # .md keeps Markdown
    page = case_html(tables)
    assert "**" not in page
    assert re.search(r"<strong>[+-]\d+\.\d%</strong>", page), page
    assert 'id="reference"' in page and 'id="cases-table"' in page


def test_console_lines_show_each_case_against_the_reference() -> None:
    tables = _versus_run()
    lines = case_lines(tables)
    assert lines[0].startswith("Cases against the reference") and "marked !" in lines[0]
    assert "**" not in "\n".join(lines)
    header = next(ln for ln in lines if "Delta TPS" in ln)
    assert header.split()[0] == "Case"
    for case in tables.versus["Case"]:
        assert any(ln.split()[0] == case and "%!" in ln for ln in lines), (case, lines)
