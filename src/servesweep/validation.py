"""Record checks: failed requests, wrong lengths, and bench_serving's silent stream failures."""

from __future__ import annotations

import logging

from servesweep.config import Workload
from servesweep.errors import CellFailed
from servesweep.recordkeys import BUILTIN_CLIENT, CLIENT_KEY, DETAIL_KEYS
from servesweep.records import BenchRecord

log = logging.getLogger(__name__)

MAX_SHOWN = 3  # problems quoted in a CellFailed message
MAX_ERROR_CHARS = 300  # of the first request error quoted


def _short(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _indices(flags: list[bool]) -> str:
    idx = [str(i) for i, f in enumerate(flags) if f]
    return ", ".join(idx[:5]) + (", ..." if len(idx) > 5 else "")


def _detail_problems(record: BenchRecord, workload: Workload) -> list[str]:
    n = workload.num_requests
    missing = [k for k in DETAIL_KEYS if getattr(record, k) is None]
    if missing:
        return [f"no per-request details ({', '.join(missing)}); run the client --output-details"]
    wrong = [k for k in DETAIL_KEYS if len(getattr(record, k)) != n]
    if wrong:
        return [f"per-request details {', '.join(wrong)} do not have {n} entries"]
    problems = []
    errors = record.errors or []
    failed = [bool(e) for e in errors]
    if any(failed):
        first = next(e for e in errors if e)
        problems.append(f"{sum(failed)} request(s) failed; first error: {_short(first)}")
    ok = [not f for f in failed]
    checks = [
        (
            [o and x != workload.input_len for o, x in zip(ok, record.input_lens, strict=True)],
            f"input_len != {workload.input_len}",
        ),
        (
            [o and x != workload.output_len for o, x in zip(ok, record.output_lens, strict=True)],
            f"output_len != {workload.output_len}",
        ),
        (
            [o and t == 0 for o, t in zip(ok, record.ttfts, strict=True)],
            "ttft 0 (no token arrived: silent stream failure)",
        ),
        (
            [o and not t for o, t in zip(ok, record.generated_texts, strict=True)],
            "empty generated text (silent stream failure)",
        ),
    ]
    for flags, what in checks:
        if any(flags):
            problems.append(f"{sum(flags)} request(s) with {what}: #{_indices(flags)}")
    return problems


def record_problems(record: BenchRecord, workload: Workload) -> list[str]:
    """Everything wrong with a cell-repeat's record for `workload`; empty if it is valid.

    Lengths must be exact (random-ids with range ratio 1, input_ids, ignore_eos). Requests that
    bench_serving counts as successes are checked for the signs of a mid-stream failure: ttft 0,
    empty text, and fewer re-tokenized than server-counted output tokens (a real re-tokenized
    count only: the builtin client records the server's count there).
    """
    problems = []
    n = workload.num_requests
    if record.completed != n:
        problems.append(f"completed {record.completed} of {n} requests")
    problems += _detail_problems(record, workload)
    done = record.completed or 0
    if record.total_input_tokens != done * workload.input_len:
        problems.append(
            f"total_input_tokens {record.total_input_tokens} != "
            f"{done} x input_len {workload.input_len}"
        )
    if record.total_output_tokens != done * workload.output_len:
        problems.append(
            f"total_output_tokens {record.total_output_tokens} != "
            f"{done} x output_len {workload.output_len}"
        )
    retok = record.total_output_tokens_retokenized
    real_retok = (record.model_extra or {}).get(CLIENT_KEY) != BUILTIN_CLIENT
    if real_retok and retok is not None and retok < (record.total_output_tokens or 0):
        problems.append(
            f"total_output_tokens_retokenized {retok} < total_output_tokens "
            f"{record.total_output_tokens} (text missing: silent stream failure)"
        )
    return problems


def check_record(
    record: BenchRecord,
    workload: Workload,
    *,
    cell: str,
    logs: list[str],
    node: str | None = None,
) -> None:
    """Raise CellFailed naming the cell, its first problems, the client's node and the log
    files, if any."""
    problems = record_problems(record, workload)
    if not problems:
        return
    shown = "; ".join(problems[:MAX_SHOWN])
    more = f" (+{len(problems) - MAX_SHOWN} more)" if len(problems) > MAX_SHOWN else ""
    where = ", ".join(logs) if logs else "none"
    client = f"; client on node {node}" if node else ""
    message = f"cell {cell}: invalid record: {shown}{more}{client}; logs: {where}"
    log.error("%s", message)
    raise CellFailed(message)
