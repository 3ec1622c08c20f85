"""The PD suite's case table (Case | Requests | Input TPS | TTFT | TPOT) from results.csv,
and each case against the reference table: as Markdown (cases.md), HTML (cases.html) and the
console's answer."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from servesweep.config.experiment import Experiment
from servesweep.config.matrix import ClientSpec, client_specs
from servesweep.config.schema import Workload

# A delta outside the reference's tolerance, as analysis.reference writes it (Markdown bold).
_BOLD = re.compile(r"\*\*(.+?)\*\*")


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


@dataclass(frozen=True)
class CaseTables:
    """A case run's tables: every case (`cases`), and each case against the reference
    (`versus`, None without one) with its `heading`; `note`: how to read a sim's times."""

    cases: pd.DataFrame
    versus: pd.DataFrame | None = None
    heading: str = ""
    note: str = ""


def case_tables(
    *, exp: Experiment, results: pd.DataFrame, reference: Sequence[str | Path]
) -> CaseTables:
    """The case table and, where the config has a `reference` (its file in `reference`),
    each case against it (the sim's times turned into simulated seconds and TPS)."""
    from servesweep.analysis.reference import load_reference, reference_table

    clients = client_specs(exp)
    table = case_table(results=results, clients=clients)
    note, factor = "", 1.0
    if exp.engine.kind == "sim" and exp.engine.sim.time_scale > 0:
        scale = exp.engine.sim.time_scale
        factor = 1 / scale
        note = (
            f"Simulated engine at time_scale {scale}: times are wall-clock; simulated "
            f"seconds = shown / {scale}, simulated TPS = shown x {scale}."
        )
    if exp.reference is None or not reference:
        return CaseTables(cases=table, note=note)
    ref = load_reference(reference[0], cases=list(exp.cases))
    versus = reference_table(
        results=results,
        clients=clients,
        reference=ref,
        tolerance=exp.reference.tolerance,
        time_factor=factor,
    )
    units = " (simulated seconds and TPS)" if factor != 1 else ""
    heading = (
        f"Against the reference{units}: {ref.source}; deltas in bold are outside "
        f"±{exp.reference.tolerance:.0%}."
    )
    return CaseTables(cases=table, versus=versus, heading=heading, note=note)


def case_markdown(tables: CaseTables) -> str:
    """cases.md: the case table, the sim's note, and the table against the reference."""
    text = markdown_table(tables.cases) + (f"\n{tables.note}\n" if tables.note else "")
    if tables.versus is not None:
        text += f"\n{tables.heading}\n\n" + markdown_table(tables.versus)
    return text


def _html_table(df: pd.DataFrame, table_id: str) -> str:
    """A table as HTML (escaped), a bold Markdown delta as <strong>."""
    page = df.to_html(index=False, border=0, table_id=table_id, escape=True)
    return _BOLD.sub(r"<strong>\1</strong>", page)


def case_html(tables: CaseTables) -> str:
    """cases.html: the validation answer first (the PD landing page shows this file), every
    case after."""
    page = _html_table(tables.cases, "cases-table")
    if tables.versus is None:
        return page
    return (
        f"<p>{html.escape(tables.heading)}</p>"
        + _html_table(tables.versus, "reference")
        + "<p>Every case of this run (medians over repeats):</p>"
        + page
    )


def case_lines(tables: CaseTables, indent: str = "  ") -> list[str]:
    """The console's case lines: against the reference where there is one (a delta outside
    the tolerance marked `!`), else every case; aligned columns."""
    df = tables.cases if tables.versus is None else tables.versus
    head = tables.heading.replace("deltas in bold", "deltas marked !") if tables.heading else ""
    rows = [list(df.columns)] + [
        [_BOLD.sub(r"\1!", str(v)) for v in row] for row in df.itertuples(index=False)
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"Cases {head[:1].lower() + head[1:]}" if head else "Cases (medians over repeats):"]
    if tables.note:
        lines.append(f"  {tables.note}")
    lines += [
        indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in rows
    ]
    return lines
