"""Record checks: failed requests, wrong lengths, silent stream failures, and drift figures."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

from servesweep.config.schema import MIN_RETOKENIZED_RATIO, Workload
from servesweep.core.errors import CellFailed
from servesweep.measure.recordkeys import DETAIL_KEYS
from servesweep.measure.records import BenchRecord

log = logging.getLogger(__name__)

MAX_SHOWN = 3  # problems quoted in a CellFailed message
MAX_ERROR_CHARS = 300  # of the first request error quoted


@dataclass(frozen=True)
class Verdict:
    """What is wrong with a record (`problems`: invalid), what is only odd (`warnings`), and
    the drift figures it carries (docs/validation.md)."""

    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    retokenized_ratio: float | None = None
    empty_texts: int | None = None  # successful requests with empty text but a first token

    @property
    def ok(self) -> bool:
        return not self.problems

    def line(self) -> str:
        """`ok`, `warning: ...` or `invalid: ...` (the worst kind first, its reasons joined)."""
        if self.problems:
            return "invalid: " + "; ".join(self.problems)
        if self.warnings:
            return "warning: " + "; ".join(self.warnings)
        return "ok"


def _short(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _indices(flags: list[bool]) -> str:
    idx = [str(i) for i, f in enumerate(flags) if f]
    return ", ".join(idx[:5]) + (", ..." if len(idx) > 5 else "")


def retokenized_ratio(record: BenchRecord) -> float | None:
    """`total_output_tokens_retokenized / total_output_tokens` (client text re-encoded vs
    server-counted tokens); None when either is absent or nothing was generated."""
    retok, total = record.total_output_tokens_retokenized, record.total_output_tokens
    if retok is None or not total:
        return None
    return retok / total


def _has_details(record: BenchRecord) -> bool:
    return all(getattr(record, k) is not None for k in DETAIL_KEYS)


def _detail_checks(record: BenchRecord, workload: Workload | None) -> tuple[list[str], list[str]]:
    """(problems, warnings) from the per-request arrays; lengths only against a workload."""
    n = len(record.errors or [])
    wrong = [k for k in DETAIL_KEYS if len(getattr(record, k)) != n]
    if workload is not None:
        n = workload.num_requests
        wrong = [k for k in DETAIL_KEYS if len(getattr(record, k)) != n]
    if wrong:
        return [f"per-request details {', '.join(wrong)} do not have {n} entries"], []
    problems: list[str] = []
    errors = record.errors or []
    failed = [bool(e) for e in errors]
    if any(failed):
        first = next(e for e in errors if e)
        problems.append(f"{sum(failed)} request(s) failed; first error: {_short(first)}")
    ok = [not f for f in failed]
    texts = record.generated_texts or []
    ttfts = record.ttfts or []
    checks: list[tuple[list[bool], str]] = []
    if workload is not None:  # server-counted lengths are exact with random-ids + ignore_eos
        checks += [
            (
                [o and x != workload.input_len for o, x in zip(ok, record.input_lens, strict=True)],
                f"input_len != {workload.input_len}",
            ),
            (
                [
                    o and x != workload.output_len
                    for o, x in zip(ok, record.output_lens, strict=True)
                ],
                f"output_len != {workload.output_len}",
            ),
        ]
    checks.append(
        (
            [o and t == 0 for o, t in zip(ok, ttfts, strict=True)],
            "ttft 0 (no token arrived: silent stream failure)",
        )
    )
    for flags, what in checks:
        if any(flags):
            problems.append(f"{sum(flags)} request(s) with {what}: #{_indices(flags)}")
    empty = [o and t != 0 and not x for o, t, x in zip(ok, ttfts, texts, strict=True)]
    warnings = []
    if any(empty):
        warnings.append(
            f"{sum(empty)} request(s) with empty text after a first token (special tokens): "
            f"#{_indices(empty)}"
        )
    return problems, warnings


def _aggregate_checks(record: BenchRecord) -> list[str]:
    """Silent-failure signs a record without per-request details still shows."""
    problems = []
    done = record.completed
    for key in ("median_ttft_ms", "mean_ttft_ms"):
        value = getattr(record, key)
        if done != 0 and value is not None and value == 0:
            over = f" over {done} completed requests" if done else ""
            problems.append(f"{key} 0.0{over} (no token arrived)")
            break
    return problems


# Figures a record states that must be finite and not negative once a request completed.
FIGURES = (
    "duration", "request_throughput", "input_throughput", "output_throughput",
    "total_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_e2e_latency_ms",
    "median_e2e_latency_ms", "p99_e2e_latency_ms",
)  # fmt: skip
# Relative: float arithmetic (numpy's sums and percentiles in another order than ours), and a
# figure computed from a rounded one and scaled (its repr shows 17 digits, it holds about 7).
# Far below any edit worth making (1%: 1e-2).
ARITHMETIC_SLACK = 1e-6
STATS = ("mean", "median", "std", "p90", "p95", "p99")  # bench_serving's, numpy's defaults


def half_unit(value: float) -> float:
    """Half a unit of the last decimal digit `value` was written with: a float's shortest
    form (JSON's, and bench_serving's printed block rounds to 2 decimals); 0 for an int (a
    count is exact)."""
    if isinstance(value, int):
        return 0.0
    mantissa, _, exponent = repr(float(value)).partition("e")
    decimals = len(mantissa.partition(".")[2]) - int(exponent or 0)
    return 0.5 * 10.0**-decimals


@dataclass(frozen=True)
class Recomputed:
    """A stated figure's value recomputed from the record's other figures or arrays, with what
    the rounding of those inputs allows (`slack`); `at_least`: a lower bound only."""

    key: str
    value: float
    source: str
    slack: float = 0.0
    at_least: bool = False

    def contradiction(self, stated: float) -> str | None:
        """`<key> <stated> contradicts <source> <value> (rounding allows +-x)`, or None. The
        allowance: half a unit of the stated figure, the inputs' rounding, float arithmetic."""
        allowed = half_unit(stated) + self.slack
        if not isinstance(self.value, int):
            allowed += ARITHMETIC_SLACK * abs(self.value)
        low = stated < self.value - allowed
        if not low and (self.at_least or stated <= self.value + allowed):
            return None
        bound = "at least " if self.at_least else ""
        allows = f"rounding allows +-{allowed:.2g}" if allowed else "a count: exact"
        return (
            f"{self.key} {stated:.6g} contradicts {self.source} {bound}{self.value:.6g} ({allows})"
        )


def _stat(values: list[float], name: str) -> float:
    """bench_serving's statistic `name` of `values` (numpy's, as it computes them; imported
    here: the Snakefile loads this module without numpy)."""
    import numpy as np

    if name == "p90" or name == "p95" or name == "p99":
        return float(np.percentile(values, int(name[1:])))
    return float({"mean": np.mean, "median": np.median, "std": np.std}[name](values))


def _per_request(
    values: list[float], slack: float, *, key: str, what: str, at_least: bool = False
) -> list[Recomputed]:
    """Each of bench_serving's statistics of a per-request series (seconds) in ms; each is
    moved by at most `slack` (s) when every value is (mean, median, percentiles; std by 2x).
    `at_least`: the series bounds the real one from below, so do its order statistics and
    mean (its std bounds nothing)."""
    if not values:
        return []
    return [
        Recomputed(
            f"{stat}_{key}_ms",
            _stat(values, stat) * 1000,
            f"the {what}' {stat}",
            slack * 1000 * (2 if stat == "std" else 1),
            at_least,
        )
        for stat in STATS
        if not (at_least and stat == "std")
    ]


def recomputed_figures(record: BenchRecord) -> list[Recomputed]:
    """Every stated figure the record's own data gives again (bench_serving's
    calculate_metrics): throughputs from the totals and the duration; with per-request
    arrays, the counts and totals, TTFT and ITL statistics exactly, and lower bounds of the
    E2E and TPOT statistics (a request's latency is at least its TTFT plus its ITLs)."""
    out: list[Recomputed] = []
    duration = record.duration or 0.0
    h = half_unit(duration)
    if duration > h:
        totals = {
            "request_throughput": (record.completed, "completed"),
            "input_throughput": (record.total_input_tokens, "total_input_tokens"),
            "output_throughput": (record.total_output_tokens, "total_output_tokens"),
        }
        if None not in (record.total_input_tokens, record.total_output_tokens):
            total = record.total_input_tokens + record.total_output_tokens  # type: ignore[operator]
            totals["total_throughput"] = (total, "total tokens")
        for key, (count, name) in totals.items():
            if count is not None:
                value = count / duration
                slack = count * h / (duration * (duration - h))
                out.append(Recomputed(key, value, f"{name} / duration =", slack))
        e2e_mean, done = _stated(record, "mean_e2e_latency_ms"), record.completed
        if e2e_mean is not None and done:
            value = e2e_mean / 1000 * done / duration
            slack = done / 1000 * (half_unit(e2e_mean) + e2e_mean * h / (duration - h)) / duration
            out.append(Recomputed("concurrency", value, "mean e2e x completed / duration =", slack))
    if not _has_details(record):
        return out
    ok = [not e for e in record.errors or []]
    rows = [
        (i, o, t, itl)
        for i, o, t, itl, good in zip(
            record.input_lens or [],
            record.output_lens or [],
            record.ttfts or [],
            record.itls or [],
            ok,
            strict=False,
        )
        if good
    ]
    out += [
        Recomputed("completed", len(rows), "the requests without an error:"),
        Recomputed("total_input_tokens", sum(r[0] for r in rows), "the input_lens' sum"),
        Recomputed("total_output_tokens", sum(record.output_lens or []), "the output_lens' sum"),
    ]
    ttfts = [r[2] for r in rows]
    itls = [x for r in rows for x in r[3]]
    # A whole value in a series of measured times (a 0.0 gap) is exact, not 1-decimal rounding.
    unit = max((half_unit(x) for x in [*ttfts, *itls] if x != int(x)), default=0.0)
    out += _per_request(ttfts, unit, key="ttft", what="ttfts")
    out += _per_request(itls, unit, key="itl", what="itls")
    # E2E: each request's latency is at least its TTFT plus its ITLs (bench_serving stops the
    # clock after the last chunk); TPOT: at least its ITLs over output_len - 1.
    least = [t + sum(gaps) for _, _, t, gaps in rows]
    slack = unit * (1 + max((len(r[3]) for r in rows), default=0))
    out += _per_request(least, slack, key="e2e_latency", what="TTFT + ITLs", at_least=True)
    tpots = [sum(gaps) / (n - 1) for _, n, _, gaps in rows if n > 1]
    out += _per_request(tpots, slack, key="tpot", what="ITLs / (output_len - 1)", at_least=True)
    return out


def _stated(record: BenchRecord, key: str) -> float | None:
    value = getattr(record, key, None)
    if value is None:
        value = (record.model_extra or {}).get(key)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _impossible_figures(record: BenchRecord) -> list[str]:
    """Figures no run produces (NaN, infinite, negative, a zero duration) and stated figures
    that contradict what the record's own totals or per-request data give again (a forged or
    broken record): `recomputed_figures`, each within what rounding allows."""
    if not record.completed:
        return []
    problems = []
    for key in FIGURES:
        value = getattr(record, key, None)
        if value is None:
            continue
        if not math.isfinite(value) or value < 0 or (key == "duration" and value == 0):
            problems.append(f"{key} {value!r} is impossible")
    if problems:
        return problems
    for figure in recomputed_figures(record):
        stated = _stated(record, figure.key)
        if stated is None or not math.isfinite(stated):
            continue
        problem = figure.contradiction(stated)
        if problem:
            problems.append(problem)
    return problems


# Datasets whose requests ask a length the record states (random_output_len and
# random_range_ratio: bench_serving draws each output length from
# [max(int(len x ratio), 1), len] and, by default, ignores EOS so the server generates it).
RANDOM_DATASETS = ("random", "random-ids")

# Re-tokenization drift worth a warning: below every healthy record of the tuned split of the
# real corpus (lowest 0.881, 2-token outputs of sglang PR 9428; then 0.940, 0.958, >= 0.989;
# tools/score_corpus.py, docs/validation.md). Above it, drift is what tokenizers do (a
# warning on every healthy record carries no signal); below `min_retokenized_ratio`, invalid.
DRIFT_WARNING_RATIO = 0.85


def stated_problems(record: BenchRecord, *, num_prompts: int | None = None) -> list[str]:
    """A record judged against the workload it states itself (outside a cell: check,
    import): every prompt completed (`num_prompts`, stated by the record, the command line
    printed with it, or given), output lengths within the random dataset's bounds, and some
    output at all."""
    problems = []
    extra = record.model_extra or {}
    done = record.completed
    wanted = num_prompts if num_prompts is not None else extra.get("num_prompts")
    if isinstance(wanted, int) and done is not None and done != wanted:
        problems.append(f"completed {done} of {wanted} requests (num_prompts {wanted})")
    if isinstance(wanted, int) and record.errors is not None and len(record.errors) != wanted:
        problems.append(
            f"per-request details have {len(record.errors)} entries, not num_prompts {wanted}"
        )
    if done and record.total_output_tokens == 0:
        problems.append(f"total_output_tokens 0 over {done} completed requests (no output)")
    ratio, out_len = extra.get("random_range_ratio"), record.random_output_len
    if (
        record.dataset_name not in RANDOM_DATASETS
        or not isinstance(ratio, (int, float))
        or not out_len
        or extra.get("disable_ignore_eos")
    ):
        return problems
    low = max(int(out_len * ratio), 1)
    stated = f"the record states random_output_len {out_len}, random_range_ratio {ratio:g}"
    if record.output_lens is not None:
        ok = [not e for e in (record.errors or [""] * len(record.output_lens))]
        bad = [o and not low <= n <= out_len for o, n in zip(ok, record.output_lens, strict=False)]
        if any(bad):
            shown = sorted({n for n, b in zip(record.output_lens, bad, strict=False) if b})[:3]
            problems.append(
                f"{sum(bad)} request(s) with output_len outside [{low}, {out_len}] "
                f"(e.g. {', '.join(map(str, shown))}): {stated}"
            )
    elif (
        done and record.total_output_tokens is not None and record.total_output_tokens < done * low
    ):
        problems.append(
            f"total_output_tokens {record.total_output_tokens} < {done} x {low}: {stated}"
        )
    return problems


def judge_record(
    record: BenchRecord,
    *,
    workload: Workload | None = None,
    min_retokenized_ratio: float = MIN_RETOKENIZED_RATIO,
    need_details: bool = True,
    num_prompts: int | None = None,
) -> Verdict:
    """Judge a bench_serving record (docs/validation.md).

    With `workload` (a cell-repeat of a run) lengths must be exact: the server-counted
    `output_lens`/`input_lens` and totals (random-ids, range ratio 1, ignore_eos), every request
    completed, per-request details present unless `need_details` is false. Without one (a record
    from elsewhere) the signs of failure and the workload the record states are judged
    (`stated_problems`, `num_prompts` given by the caller). Everywhere: a failed request or a
    request whose first token never arrived (ttft 0) is invalid; a re-tokenized count below
    `min_retokenized_ratio` of the server's count is invalid (text missing), below
    DRIFT_WARNING_RATIO drift (a warning with the figure); empty text after a first token is a
    warning.
    """
    problems: list[str] = []
    warnings: list[str] = []
    done = record.completed or 0
    if workload is not None and record.completed != workload.num_requests:
        problems.append(f"completed {record.completed} of {workload.num_requests} requests")
    elif workload is None and record.completed is not None and record.completed < 1:
        problems.append(f"completed {record.completed} requests")
    empty_texts = None
    if _has_details(record):
        detail_problems, detail_warnings = _detail_checks(record, workload)
        problems += detail_problems
        warnings += detail_warnings
        texts, ttfts = record.generated_texts or [], record.ttfts or []
        empty_texts = sum(1 for t, x in zip(ttfts, texts, strict=False) if t != 0 and not x)
    else:
        missing = [k for k in DETAIL_KEYS if getattr(record, k) is None]
        if workload is not None and need_details:
            problems.append(
                f"no per-request details ({', '.join(missing)}); run the client --output-details"
            )
        problems += _aggregate_checks(record)
    problems += _impossible_figures(record)
    if workload is None:
        problems += stated_problems(record, num_prompts=num_prompts)
    else:
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
    ratio = retokenized_ratio(record)
    if ratio is not None and not math.isnan(ratio):
        figure = (
            f"retokenized_ratio {ratio:.4f} ({record.total_output_tokens_retokenized} re-tokenized"
            f" of {record.total_output_tokens} server-counted output tokens)"
        )
        if ratio < min_retokenized_ratio:
            problems.append(
                f"{figure} < validation.min_retokenized_ratio {min_retokenized_ratio} "
                "(text missing: silent stream failure)"
            )
        elif ratio < DRIFT_WARNING_RATIO:
            warnings.append(f"{figure} < {DRIFT_WARNING_RATIO}: re-tokenization drift")
    return Verdict(problems, warnings, ratio, empty_texts)


def record_problems(
    record: BenchRecord,
    workload: Workload,
    *,
    min_retokenized_ratio: float = MIN_RETOKENIZED_RATIO,
) -> list[str]:
    """Everything that makes a cell-repeat's record for `workload` invalid; empty if valid."""
    return judge_record(
        record, workload=workload, min_retokenized_ratio=min_retokenized_ratio
    ).problems


def check_record(
    record: BenchRecord,
    workload: Workload,
    *,
    cell: str,
    logs: list[str],
    node: str | None = None,
    min_retokenized_ratio: float = MIN_RETOKENIZED_RATIO,
) -> Verdict:
    """Log the record's warnings; raise CellFailed naming the cell, its first problems, the
    client's node and the log files, if it is invalid."""
    verdict = judge_record(record, workload=workload, min_retokenized_ratio=min_retokenized_ratio)
    for warning in verdict.warnings:
        log.warning("cell %s: %s", cell, warning)
    problems = verdict.problems
    if not problems:
        return verdict
    shown = "; ".join(problems[:MAX_SHOWN])
    more = f" (+{len(problems) - MAX_SHOWN} more)" if len(problems) > MAX_SHOWN else ""
    where = ", ".join(logs) if logs else "none"
    client = f"; client on node {node}" if node else ""
    error = CellFailed(f"invalid record: {shown}{more}{client}", cell=cell, log=f"logs: {where}")
    log.error("%s", error)
    raise error
