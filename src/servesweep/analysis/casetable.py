"""The PD suite's case table (Case | Requests | Input TPS | TTFT | TPOT) from results.csv."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from servesweep.config.matrix import ClientSpec
from servesweep.config.schema import Workload


def _tokens(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def case_label(workload: Workload) -> str:
    """'16K -> 512, C8' (+ ', non-streaming'), as the seed's table names cases."""
    label = f"{_tokens(workload.input_len)} -> {_tokens(workload.output_len)}, "
    label += f"C{workload.concurrency}"
    return label + ("" if workload.stream else ", non-streaming")


def case_table(*, results: pd.DataFrame, clients: Sequence[ClientSpec]) -> pd.DataFrame:
    """One row per case (medians over repeats): Case | Requests | Input TPS | TTFT P50 / P95 |
    TPOT P50 / P95; TPOT is N/A where a request makes one token or does not stream."""
    rows = []
    for client in clients:
        cell = results[results["client_id"] == client.id]
        if cell.empty:
            continue
        w = client.workload
        med = cell[["input_tps", "ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms", "tpot_p95_ms"]]
        med = med.median()
        tpot = "N/A"
        if w.output_len > 1 and w.stream:
            tpot = f"{med['tpot_p50_ms']:.2f} / {med['tpot_p95_ms']:.2f} ms"
        rows.append(
            {
                "Case": case_label(w),
                "Requests": w.num_requests,
                "Input TPS": f"{med['input_tps']:.2f}",
                "TTFT P50 / P95": (
                    f"{med['ttft_p50_ms'] / 1000:.3f} / {med['ttft_p95_ms'] / 1000:.3f} s"
                ),
                "TPOT P50 / P95": tpot,
            }
        )
    return pd.DataFrame(
        rows, columns=["Case", "Requests", "Input TPS", "TTFT P50 / P95", "TPOT P50 / P95"]
    )


def markdown_table(df: pd.DataFrame) -> str:
    """A GitHub markdown table (numbers right-aligned as in the seed's write-up)."""
    head = "| " + " | ".join(df.columns) + " |"
    align = (
        "|"
        + "|".join(
            "---:" if c == "Requests" or "/" in c or "TPS" in c else "---" for c in df.columns
        )
        + "|"
    )
    body = ["| " + " | ".join(str(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, align, *body]) + "\n"
