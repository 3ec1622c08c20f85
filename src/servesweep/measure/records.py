"""The bench record as the workflow reads it: SGLang bench_serving's JSONL schema, validated
for both clients' records (the key layout is in recordkeys, which the client itself uses)."""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from servesweep.core.bounds import loads_json
from servesweep.core.files import restore_non_finite, strict_json, write_text_atomic

# run_cell's copy of where its server's start went (ServerState.start_phases: `ready_s` and
# serving.logscan.startup_phases), under this key of the record; results.csv `start_<phase>`.
START_KEY = "server_start"
START_PHASES = ("ready_s", "imports_s", "load_weight_s", "cuda_graph_s", "warmup_s")
# run_cell's per-cell log evidence counts (serving.evidence) under this key of the record;
# results.csv: one `evidence_<name>` column each.
EVIDENCE_KEY = "servesweep_evidence"
EVIDENCE_COLUMN_PREFIX = "evidence_"


class BenchRecord(BaseModel):
    """One bench_serving-compatible record; unknown keys are kept, absent ones are None."""

    model_config = ConfigDict(extra="allow")

    tag: str | None = None
    backend: str | None = None
    dataset_name: str | None = None
    request_rate: float | None = None
    max_concurrency: int | None = None
    random_input_len: int | None = None
    random_output_len: int | None = None
    duration: float | None = None
    completed: int | None = None
    total_input_tokens: int | None = None
    total_output_tokens: int | None = None
    total_output_tokens_retokenized: int | None = None
    request_throughput: float | None = None
    input_throughput: float | None = None
    output_throughput: float | None = None
    mean_e2e_latency_ms: float | None = None
    median_e2e_latency_ms: float | None = None
    p99_e2e_latency_ms: float | None = None
    mean_ttft_ms: float | None = None
    median_ttft_ms: float | None = None
    p95_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    median_tpot_ms: float | None = None
    p95_tpot_ms: float | None = None
    median_itl_ms: float | None = None
    concurrency: float | None = None
    input_lens: list[int] | None = None
    output_lens: list[int] | None = None
    ttfts: list[float] | None = None
    itls: list[list[float]] | None = None
    generated_texts: list[str] | None = None
    errors: list[str] | None = None

    def to_json_line(self) -> str:
        """One JSONL line in bench_serving's layout, but strict JSON: a non-finite figure
        (request_rate inf) is null, and `non_finite` says what it was (files.finite_json)."""
        return strict_json(self.model_dump(exclude_none=False)) + "\n"


def parse_record_line(line: str, *, keys: Collection[str] | None = None) -> BenchRecord:
    """Parse one JSONL line: bench_serving's own (`Infinity` as Python's json writes it) or
    ours (null + `non_finite`, restored here).

    With `keys`, only those keys are validated and kept: much cheaper when a caller needs a
    few figures of a record with per-request details.
    """
    data = restore_non_finite(loads_json(line))
    if keys is not None and isinstance(data, dict):
        data = {k: data[k] for k in keys if k in data}
    return BenchRecord.model_validate(data)


def read_records(path: str | Path, *, keys: Collection[str] | None = None) -> list[BenchRecord]:
    """All records of a JSONL file (bench_serving appends one line per invocation)."""
    lines = Path(path).read_text().splitlines()
    return [parse_record_line(line, keys=keys) for line in lines if line.strip()]


def read_record(path: str | Path, *, keys: Collection[str] | None = None) -> BenchRecord:
    """The single record of a raw cell-repeat file; more or fewer lines is an error.

    `keys` as in parse_record_line.
    """
    records = read_records(path, keys=keys)
    if len(records) != 1:
        raise ValueError(f"{path}: expected exactly one record, found {len(records)}")
    return records[0]


def write_record(path: str | Path, record: BenchRecord | dict[str, Any]) -> None:
    """Write one record as a one-line JSONL file, atomically."""
    rec = record if isinstance(record, BenchRecord) else BenchRecord.model_validate(record)
    write_text_atomic(path, rec.to_json_line())


# bench_serving's printed "Serving Benchmark Result" labels (lower case, without the colon)
# -> record keys; the older "Max reqeuest concurrency" typo included.
PRINTED_LABELS: dict[str, str] = {
    "backend": "backend",
    "traffic request rate": "request_rate",
    "max request concurrency": "max_concurrency",
    "max reqeuest concurrency": "max_concurrency",
    "successful requests": "completed",
    "benchmark duration (s)": "duration",
    "total input tokens": "total_input_tokens",
    "total generated tokens": "total_output_tokens",
    "total generated tokens (retokenized)": "total_output_tokens_retokenized",
    "request throughput (req/s)": "request_throughput",
    "input token throughput (tok/s)": "input_throughput",
    "output token throughput (tok/s)": "output_throughput",
    "concurrency": "concurrency",
    "mean e2e latency (ms)": "mean_e2e_latency_ms",
    "median e2e latency (ms)": "median_e2e_latency_ms",
    "p99 e2e latency (ms)": "p99_e2e_latency_ms",
    "mean ttft (ms)": "mean_ttft_ms",
    "median ttft (ms)": "median_ttft_ms",
    "p95 ttft (ms)": "p95_ttft_ms",
    "p99 ttft (ms)": "p99_ttft_ms",
    "median tpot (ms)": "median_tpot_ms",
    "median itl (ms)": "median_itl_ms",
}
PRINTED_MARKERS = ("Serving Benchmark Result", "Total generated tokens")


def is_printed_result(text: str) -> bool:
    """True if `text` holds bench_serving's printed result block (or lines of one)."""
    return any(marker in text for marker in PRINTED_MARKERS)


def _printed_value(key: str, raw: str) -> Any:
    if key == "backend":
        return raw
    if raw.lower() in ("not set", ""):
        return None
    number = float(raw)  # "inf" included
    if key in BenchRecord.model_fields and "int" in str(BenchRecord.model_fields[key].annotation):
        return int(number)
    return number


# The bench_serving command line printed with a block states the workload the block ran:
# its options (argparse takes an unambiguous prefix: `--num-prompt`, `--random-output`).
COMMAND_LINE = re.compile(r"\bbench_serving\b|\bbenchmark[._]serving\b")
COMMAND_OPTIONS: dict[str, tuple[re.Pattern[str], type]] = {
    "num_prompts": (re.compile(r"--num-prompts?[= ]+(\d+)"), int),
    "dataset_name": (re.compile(r"--dataset-name[= ]+([\w-]+)"), str),
    "random_input_len": (re.compile(r"--random-input(?:-len)?[= ]+(\d+)"), int),
    "random_output_len": (re.compile(r"--random-output(?:-len)?[= ]+(\d+)"), int),
    "random_range_ratio": (re.compile(r"--random-range-ratio[= ]+([\d.]+)"), float),
}


def stated_options(line: str) -> dict[str, Any]:
    """The workload options a bench_serving command line states (none: {})."""
    if not COMMAND_LINE.search(line):
        return {}
    found = {}
    for key, (rx, kind) in COMMAND_OPTIONS.items():
        match = rx.search(line)
        if match:
            found[key] = kind(match.group(1))
    return found


def parse_printed_result(text: str) -> BenchRecord:
    """A record from bench_serving's printed result block: the labelled figures it shows
    (no per-request details) and the workload a bench_serving command line printed with it
    states (`num_prompts`, `dataset_name`, `random_*`); unknown labels are skipped, a bad number
    raises ValueError."""
    data: dict[str, Any] = {}
    for line in text.splitlines():
        if line.lstrip().startswith(("python", "$", "#")) or "--" in line:
            data.update(stated_options(line))
            continue
        label, sep, value = line.partition(":")
        key = PRINTED_LABELS.get(label.strip().lower())
        if sep and key is not None:
            data[key] = _printed_value(key, value.strip())
    if not set(data) & set(PRINTED_LABELS.values()):
        raise ValueError("no bench_serving result lines")
    return BenchRecord.model_validate(data)
