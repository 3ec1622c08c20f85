"""A validated reference table (seed 003's) and each case's delta against it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from servesweep.config.matrix import ClientSpec
from servesweep.core.errors import ConfigError

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = [
    "Case",
    "TTFT P50 / P95",
    "Reference",
    "Delta P50 / P95",
    "Input TPS",
    "Reference TPS",
    "Delta TPS",
    "TPOT P50 / P95",
    "Reference TPOT",
    "Delta TPOT P50 / P95",
]


class ReferenceCase(BaseModel):
    """One validated row: requests, input TPS, TTFT P50/P95 (s), TPOT P50/P95 (ms or null)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests: int
    input_tps: float
    ttft_p50_s: float
    ttft_p95_s: float
    tpot_p50_ms: float | None = None
    tpot_p95_ms: float | None = None


class ReferenceTable(BaseModel):
    """A reference file: where it comes from, and its rows by case name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str
    cases: dict[str, ReferenceCase]


def load_reference(path: str | Path, *, cases: Sequence[str]) -> ReferenceTable:
    """Read and check a reference file; ConfigError (one line, naming `reference.file`) when
    it is unreadable, malformed, or names a case the experiment does not have."""
    try:
        table = ReferenceTable.model_validate(yaml.safe_load(Path(path).read_text()))
    except OSError as exc:
        raise ConfigError(f"config key 'reference.file': cannot read {path}: {exc}") from None
    except (ValidationError, yaml.YAMLError) as exc:
        first = str(exc).splitlines()[0]
        raise ConfigError(f"config key 'reference.file': {path} is malformed: {first}") from None
    unknown = sorted(set(table.cases) - set(cases))
    if unknown:
        raise ConfigError(
            f"config key 'reference.file': {path} has cases {unknown} that are not in cases"
        )
    return table


def _delta(value: float, ref: float, tolerance: float) -> str:
    """`+3.4%`, bold when outside the tolerance; `N/A` without a reference."""
    if ref == 0 or math.isnan(value):
        return "N/A"
    delta = round(value / ref - 1, 6) + 0.0  # no "-0.0%" from float noise
    text = f"{delta:+.1%}"
    return f"**{text}**" if abs(delta) > tolerance else text


def reference_table(
    *,
    results: pd.DataFrame,
    clients: Sequence[ClientSpec],
    reference: ReferenceTable,
    tolerance: float,
    time_factor: float = 1.0,
) -> pd.DataFrame:
    """One row per case the reference has: this run's TTFT P50/P95, input TPS and TPOT P50/P95
    (medians over repeats) beside the reference's, with the relative delta, bold when |delta|
    > tolerance (TPOT: N/A where either side has none).
    `time_factor` turns measured seconds into the reference's (the sim's 1 / time_scale; input
    TPS is divided by it)."""
    import pandas as pd  # here: the Snakefile loads the reference without pandas

    rows = []
    labels: Mapping[str, str] = {c.id: c.axes.get("case", c.id) for c in clients}
    for client in clients:
        name = labels[client.id]
        ref = reference.cases.get(name)
        cell = results[results["client_id"] == client.id]
        if ref is None or cell.empty:
            continue
        figures = ["input_tps", "ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms", "tpot_p95_ms"]
        med = cell.reindex(columns=figures).apply(pd.to_numeric, errors="coerce").median()
        p50 = med["ttft_p50_ms"] / 1000 * time_factor
        p95 = med["ttft_p95_ms"] / 1000 * time_factor
        tps = med["input_tps"] / time_factor
        # TPOT in ms, like the case table; N/A where a case makes one token or none streams
        t50, t95 = med["tpot_p50_ms"] * time_factor, med["tpot_p95_ms"] * time_factor
        has_ref = ref.tpot_p50_ms is not None and ref.tpot_p95_ms is not None
        rows.append(
            {
                "Case": name,
                "TTFT P50 / P95": f"{p50:.3f} / {p95:.3f} s",
                "Reference": f"{ref.ttft_p50_s:.3f} / {ref.ttft_p95_s:.3f} s",
                "Delta P50 / P95": (
                    f"{_delta(p50, ref.ttft_p50_s, tolerance)} / "
                    f"{_delta(p95, ref.ttft_p95_s, tolerance)}"
                ),
                "Input TPS": f"{tps:.2f}",
                "Reference TPS": f"{ref.input_tps:.2f}",
                "Delta TPS": _delta(tps, ref.input_tps, tolerance),
                "TPOT P50 / P95": "N/A" if math.isnan(t50) else f"{t50:.2f} / {t95:.2f} ms",
                "Reference TPOT": (
                    f"{ref.tpot_p50_ms:.2f} / {ref.tpot_p95_ms:.2f} ms" if has_ref else "N/A"
                ),
                "Delta TPOT P50 / P95": (
                    f"{_delta(t50, ref.tpot_p50_ms or 0.0, tolerance)} / "
                    f"{_delta(t95, ref.tpot_p95_ms or 0.0, tolerance)}"
                    if has_ref and not math.isnan(t50)
                    else "N/A"
                ),
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)
