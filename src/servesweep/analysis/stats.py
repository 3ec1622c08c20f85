"""Hierarchical bootstrap over repeats and requests: intervals, % deltas and verdicts."""

from __future__ import annotations

import logging
import math
import zlib
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from servesweep.measure.records import BenchRecord

log = logging.getLogger(__name__)

REPLICATES = 2000
SEED = 20250917
LEVEL = 0.95
# Fewer distinct repeat resamples than this (n <= 4 repeats) and a cell's interval is coarse.
COARSE_BELOW = 100
# Elements drawn per request-resampling chunk (bounds memory for repeats with many requests).
CHUNK_ELEMENTS = 2_000_000

BETTER, WORSE, NOISE, UNKNOWN = "better", "worse", "within noise", "unknown"
VERDICTS = (BETTER, WORSE, NOISE, UNKNOWN)
RESAMPLED_REQUESTS = "repeats+requests"
RESAMPLED_REPEATS = "repeats"

# Metrics recomputable from per-request details: metric -> (per-request figure, statistic),
# the statistic being a percentile (numpy's linear one, as bench_serving uses) or "mean".
REQUEST_METRICS: dict[str, tuple[str, float | str]] = {
    "ttft_p50_ms": ("ttft", 50.0),
    "ttft_p95_ms": ("ttft", 95.0),
    "ttft_p99_ms": ("ttft", 99.0),
    "ttft_mean_ms": ("ttft", "mean"),
    "e2e_p50_ms": ("e2e", 50.0),
    "e2e_p99_ms": ("e2e", 99.0),
    "e2e_mean_ms": ("e2e", "mean"),
    "tpot_p50_ms": ("tpot", 50.0),
    "tpot_p95_ms": ("tpot", 95.0),
    "ttft_p99_9_ms": ("ttft", 99.9),
    "tpot_p99_ms": ("tpot", 99.0),
}
FIGURES = ("ttft", "e2e", "tpot")
# The record keys requests_of reads (records are read with these only).
REQUEST_KEYS = ("tag", "ttfts", "itls", "output_lens", "errors")


@dataclass(frozen=True)
class Bootstrap:
    """Bootstrap settings: replicates B, base seed and interval level."""

    replicates: int = REPLICATES
    seed: int = SEED
    level: float = LEVEL

    def __post_init__(self) -> None:
        if self.replicates < 1:
            raise ValueError(f"replicates must be >= 1, not {self.replicates}")
        if not 0 < self.level < 1:
            raise ValueError(f"level must be in (0, 1), not {self.level}")


DEFAULT = Bootstrap()


@dataclass(frozen=True)
class Requests:
    """Per-request figures (ms) of one repeat's successful requests, each sorted ascending."""

    ttft: np.ndarray
    e2e: np.ndarray
    tpot: np.ndarray  # only requests with more than one output token

    def figure(self, name: str) -> np.ndarray:
        return getattr(self, name)


@dataclass(frozen=True)
class Replicates:
    """Bootstrap replicates of one cell statistic (the median over repeats of a figure)."""

    values: np.ndarray  # shape (B,)
    n_repeats: int
    requests: bool  # requests were resampled within each drawn repeat

    @property
    def resampled(self) -> str:
        return RESAMPLED_REQUESTS if self.requests else RESAMPLED_REPEATS

    @property
    def spread_known(self) -> bool:
        """False for one repeat without per-request data: nothing says how noisy it is."""
        return self.n_repeats > 1 or self.requests

    @property
    def coarse(self) -> bool:
        return is_coarse(self.n_repeats)


# ---------------------------------------------------------------- per-request data


@dataclass(frozen=True)
class RequestDetails:
    """Per-request figures (ms) of every request sent, in record order; NaN where undefined
    (TPOT of a one-token or unstreamed output, everything of a failed request)."""

    ok: np.ndarray  # bool
    ttft: np.ndarray
    tpot: np.ndarray
    e2e: np.ndarray
    output_lens: np.ndarray
    itl: np.ndarray  # every inter-token latency of the successful requests, flat


def request_details(record: BenchRecord, *, stream: bool = True) -> RequestDetails | None:
    """Per-request figures of a record; None without usable details.

    Successful requests are those with an empty error. E2E per request is ttft + sum(itls)
    (bench_serving's latency also includes the wait for the end of the stream); TPOT is
    sum(itls) / (output_len - 1) for requests with more than one output token. Without
    `stream` (the workload's) each response arrived whole: no TPOT (NaN) and no ITL.
    """
    ttfts, itls = record.ttfts, record.itls
    if ttfts is None or itls is None or len(ttfts) != len(itls):
        return None
    n = len(ttfts)
    errors = record.errors if record.errors is not None else [""] * n
    outs = record.output_lens if record.output_lens is not None else [len(i) + 1 for i in itls]
    if len(errors) != n or len(outs) != n:
        log.warning("record %s: per-request details of unequal lengths; ignored", record.tag)
        return None
    ok = np.array([not e for e in errors], dtype=bool)
    ttft = np.where(ok, np.array(ttfts, dtype=float) * 1000.0, np.nan)
    gen = np.fromiter(map(math.fsum, itls), dtype=float, count=n) * 1000.0
    out = np.array(outs, dtype=float)
    multi = ok & (out > 1) & stream
    tpot = np.full(n, np.nan)
    tpot[multi] = gen[multi] / (out[multi] - 1)
    flat = [x for i, good in zip(itls, ok, strict=True) if good and stream for x in i]
    return RequestDetails(
        ok=ok,
        ttft=ttft,
        tpot=tpot,
        e2e=np.where(ok, ttft + gen, np.nan),
        output_lens=np.where(ok, out, 0.0),
        itl=np.array(flat, dtype=float) * 1000.0,
    )


def request_figures(record: BenchRecord) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """TTFT, E2E and TPOT (ms) of each successful request of a record, in record order (TPOT
    NaN for a one-token output); None without a successful request."""
    return successful_figures(request_details(record))


def successful_figures(
    details: RequestDetails | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """TTFT, E2E and TPOT (ms) of the successful requests of `details`; None without any."""
    if details is None or not details.ok.any():
        return None
    ok = details.ok
    return details.ttft[ok], details.e2e[ok], details.tpot[ok]


def sorted_requests(ttft: np.ndarray, e2e: np.ndarray, tpot: np.ndarray) -> Requests:
    """Requests from per-request figures as request_figures gives them (NaN TPOTs dropped)."""
    return Requests(ttft=np.sort(ttft), e2e=np.sort(e2e), tpot=np.sort(tpot[~np.isnan(tpot)]))


def requests_of(record: BenchRecord) -> Requests | None:
    """Per-request figures of a record, sorted (request_figures); None without details."""
    figures = request_figures(record)
    return None if figures is None else sorted_requests(*figures)


# ---------------------------------------------------------------- statistics


def distinct_resamples(n: int) -> int:
    """Distinct multisets of n repeats drawn with replacement from n: C(2n-1, n)."""
    return math.comb(2 * n - 1, n) if n > 0 else 0


def is_coarse(n: int) -> bool:
    return distinct_resamples(n) < COARSE_BELOW


def _ranks(n: int, percentile: float) -> tuple[float, int, int]:
    """(h, lo, hi) of numpy's linear percentile of n sorted values: values[lo], values[hi]."""
    h = (n - 1) * percentile / 100.0
    lo = int(math.floor(h))
    return h, lo, min(lo + 1, n - 1)


def _stat_of_sorted(
    values: np.ndarray,
    starts: np.ndarray,
    order: np.ndarray,
    stat: float | str,
    cache: dict[int, np.ndarray],
) -> np.ndarray:
    """The statistic of each resample i: values[starts[i] + order[i]], where the m values from
    each start are sorted and each row of `order` (positions 0..m-1) is ascending; `cache`
    keeps the positions of order's columns for the next statistic of the same draw."""
    if stat == "mean":
        return values.take(starts[:, None] + order).mean(axis=1)
    h, lo, hi = _ranks(order.shape[1], float(stat))
    for col in (lo, hi):
        if col not in cache:
            cache[col] = starts + order[:, col]
    below = values.take(cache[lo])
    return below + (h - lo) * (values.take(cache[hi]) - below)


def figure_stat(values: np.ndarray, stat: float | str) -> float:
    """One statistic of sorted values (numpy's linear percentile, or the mean)."""
    if stat == "mean":
        return float(values.mean())
    return _linear(values, *_ranks(len(values), float(stat)))


def _linear(values: np.ndarray, h: float, lo: int, hi: int) -> float:
    """numpy's linear percentile at rank h of values whose positions lo and hi hold what a
    sort would put there."""
    return float(values[lo] + (h - lo) * (values[hi] - values[lo]))


def _row_median(x: np.ndarray) -> np.ndarray:
    """Median along the last axis (np.median's answer, cheaper for the few repeats); x is
    sorted in place (numpy's vectorised sort of short rows beats its partition several
    times over), the result is a new array."""
    n = x.shape[-1]
    mid = n // 2
    x.sort(axis=-1)
    if n % 2:
        return x[..., mid].copy()
    return 0.5 * (x[..., mid - 1] + x[..., mid])


def _rng(bootstrap: Bootstrap, *parts: str) -> np.random.Generator:
    words = tuple(zlib.crc32(p.encode()) for p in parts)
    return np.random.default_rng(np.random.SeedSequence(bootstrap.seed, spawn_key=words))


def _drawn_repeat_figures(
    *,
    metrics: Sequence[str],
    repeats: Sequence[Requests],
    anchors: np.ndarray,
    picks: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """(len(metrics), *picks.shape): each drawn repeat's figures from its resampled requests.

    `picks` are the drawn repeats (positions in `repeats`), `anchors[k, j]` the record value
    of metric k in repeat j. Every slot of `picks` gets its own resample with replacement of
    its repeat's requests, whose figures are first shifted by (record value - figure of the
    repeat's own requests): the recomputed figure is anchored on the record. One draw of
    resampled positions serves all slots whose repeats have the same request count m, in
    row-major order (in chunks of CHUNK_ELEMENTS); the metrics share it (each metric's
    bootstrap distribution is exact; statistics are never combined across metrics).
    """
    figures = [REQUEST_METRICS[metric] for metric in metrics]
    sizes = np.array([len(r.figure(figures[0][0])) for r in repeats])  # same for every metric
    drawn = picks.ravel()
    out = np.empty((len(metrics), drawn.size))
    for m in dict.fromkeys(sizes.tolist()):
        members = np.flatnonzero(sizes == m)
        slots = None  # the common case: every repeat has m requests, every slot is served
        starts = drawn * m  # where each slot's repeat starts in the joined figures of members
        if members.size < len(repeats):
            local = np.zeros(len(repeats), dtype=np.intp)
            local[members] = np.arange(members.size)
            slots = np.flatnonzero(sizes[drawn] == m)
            starts = local[drawn[slots]] * m
        shifted = []
        for k, (name, stat) in enumerate(figures):
            own = [repeats[j].figure(name) for j in members]
            offsets = anchors[k, members] - [figure_stat(v, stat) for v in own]
            shifted.append(np.concatenate([v + d for v, d in zip(own, offsets, strict=True)]))
        dtype = np.int16 if m < 2**15 else np.int32
        # As few chunks as CHUNK_ELEMENTS allows, of about equal size.
        chunks = max(1, -(-starts.size * m // CHUNK_ELEMENTS))
        chunk = max(1, -(-starts.size // chunks))
        for start in range(0, starts.size, chunk):
            part = slice(start, min(starts.size, start + chunk))
            order = rng.integers(0, m, size=(part.stop - start, m), dtype=dtype)
            # Resampled positions of sorted figures: percentiles read their ranks, a mean sums
            # every position in sorted order. A full sort of the short rows (numpy's
            # vectorised sort) is several times cheaper than partitioning at the ranks.
            order.sort(axis=1)
            target = part if slots is None else slots[part]
            cache: dict[int, np.ndarray] = {}
            for k, (_, stat) in enumerate(figures):
                out[k, target] = _stat_of_sorted(shifted[k], starts[part], order, stat, cache)
    return out.reshape(len(metrics), *picks.shape)


def cell_replicates(
    *,
    values: Mapping[str, Sequence[float] | np.ndarray],
    requests: Sequence[Requests | None] | None,
    key: str,
    bootstrap: Bootstrap = DEFAULT,
) -> dict[str, Replicates | None]:
    """Bootstrap replicates of the median over repeats of each metric of one cell.

    `values[metric]` are the record values of the cell's repeats; `requests` (same order, or
    None) their per-request figures. Repeats are resampled with replacement; for metrics in
    REQUEST_METRICS whose repeats all have per-request data the requests of each drawn repeat
    are resampled too and the per-repeat figure recomputed, shifted by (record value - figure
    of the repeat's own requests) so it stays anchored on the record. Repeats with a missing
    value are left out; a metric without any value gives None. `key` seeds the streams: one
    per (repeats used, request counts), so a metric's replicates do not depend on which other
    metrics are asked for.
    """
    out: dict[str, Replicates | None] = {}
    groups: dict[tuple[tuple[int, ...], tuple[int, ...] | None], list[str]] = {}
    arrays = {m: np.asarray(v, dtype=float) for m, v in values.items()}
    for metric, vals in arrays.items():
        used = tuple(int(i) for i in np.flatnonzero(np.isfinite(vals)))
        if not used:
            out[metric] = None
            continue
        groups.setdefault((used, _request_sizes(metric, requests, used)), []).append(metric)
    for (used, sizes), metrics in groups.items():
        tag = "record" if sizes is None else "requests:" + ",".join(map(str, sizes))
        rng = _rng(bootstrap, key, tag, ",".join(map(str, used)))
        picks = rng.integers(0, len(used), size=(bootstrap.replicates, len(used)))
        if sizes is None:
            record = np.array([arrays[m][list(used)] for m in metrics])
            medians = _row_median(record[:, picks])
            for k, metric in enumerate(metrics):
                out[metric] = Replicates(medians[k], len(used), False)
            continue
        assert requests is not None
        repeats = [r for r in (requests[i] for i in used) if r is not None]
        assert len(repeats) == len(used)  # _request_sizes: every used repeat has requests
        per_repeat = _drawn_repeat_figures(
            metrics=metrics,
            repeats=repeats,
            anchors=np.array([arrays[m][list(used)] for m in metrics]),
            picks=picks,
            rng=rng,
        )
        medians = _row_median(per_repeat)
        for k, metric in enumerate(metrics):
            out[metric] = Replicates(medians[k], len(used), True)
    return {m: out[m] for m in values}


def _request_sizes(
    metric: str, requests: Sequence[Requests | None] | None, used: Iterable[int]
) -> tuple[int, ...] | None:
    """Request counts of the metric's figure in the used repeats; None: repeats only."""
    if metric not in REQUEST_METRICS or requests is None:
        return None
    figure = REQUEST_METRICS[metric][0]
    sizes = []
    for i in used:
        r = requests[i] if i < len(requests) else None
        if r is None or len(r.figure(figure)) == 0:
            return None
        sizes.append(len(r.figure(figure)))
    return tuple(sizes)


def interval(values: np.ndarray, *, level: float = LEVEL) -> tuple[float, float] | None:
    """Percentile interval of bootstrap replicates (non-finite ones dropped); None if none.
    Only the ranks the two percentiles read are put in place (np.partition, not a sort)."""
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return None
    tail = 50.0 * (1.0 - level)
    low, high = _ranks(finite.size, tail), _ranks(finite.size, 100.0 - tail)
    placed = np.partition(finite, sorted({*low[1:], *high[1:]}))
    return _linear(placed, *low), _linear(placed, *high)


def delta_pct(candidate: np.ndarray, baseline: np.ndarray) -> np.ndarray:
    """% delta per replicate: 100 x (candidate - baseline) / baseline (inf/NaN where 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return 100.0 * (candidate - baseline) / baseline


def verdict(
    *, low: float | None, high: float | None, better: str, spread_known: bool = True
) -> str:
    """`within noise` if [low, high] holds 0, else `better`/`worse` by the metric's direction.

    `unknown` without an interval, or when a side has no spread estimate (one repeat and no
    per-request data): a single number cannot tell a change from noise.
    """
    if low is None or high is None or not spread_known:
        return UNKNOWN
    if low <= 0.0 <= high:
        return NOISE
    up = low > 0.0
    if better == "lower":
        return WORSE if up else BETTER
    if better == "higher":
        return BETTER if up else WORSE
    raise ValueError(f"better must be 'lower' or 'higher', not {better!r}")


@dataclass(frozen=True)
class Delta:
    """A % delta of a candidate vs a baseline with its bootstrap interval, verdict and
    two-sided bootstrap p-value (before control_fdr)."""

    low: float | None
    high: float | None
    verdict: str
    coarse: bool
    p_value: float | None = None


def p_value(deltas: np.ndarray) -> float | None:
    """Two-sided bootstrap p-value of a % delta being 0: twice the share of replicates on the
    smaller side of 0 (at most 1); below 1 - level exactly when the percentile interval
    excludes 0. None without finite replicates."""
    finite = deltas[np.isfinite(deltas)]
    if finite.size == 0:
        return None
    # Shares as np.mean of the flags gives them (count / size), without its reduction.
    below = np.count_nonzero(finite <= 0.0) / finite.size
    above = np.count_nonzero(finite >= 0.0) / finite.size
    return min(1.0, 2.0 * min(below, above))


def fdr_adjusted(p_values: Sequence[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (step-up), in the order given."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [1.0] * m
    running = 1.0
    for rank in range(m, 0, -1):
        i = order[rank - 1]
        running = min(running, p_values[i] * m / rank)
        adjusted[i] = min(1.0, running)
    return adjusted


def control_fdr(tests: Sequence[MutableMapping[str, Any]], *, level: float = LEVEL) -> int:
    """The verdicts of one comparison's tests (dicts with `p_value`, `verdict`) under a
    false-discovery rate of 1 - level (MULTIPLICITY): each gets `p_adjusted`, and a
    better/worse whose adjusted p-value is not below 1 - level becomes within noise. Returns
    how many were downgraded."""
    tested = [t for t in tests if t.get("p_value") is not None and t.get("verdict") != UNKNOWN]
    downgraded = 0
    for test, adjusted in zip(
        tested, fdr_adjusted([float(t["p_value"]) for t in tested]), strict=True
    ):
        test["p_adjusted"] = adjusted
        if test["verdict"] in (BETTER, WORSE) and adjusted >= 1.0 - level:
            test["verdict"] = NOISE
            downgraded += 1
    return downgraded


def compare_replicates(
    candidate: Replicates | None,
    baseline: Replicates | None,
    *,
    better: str,
    level: float = LEVEL,
) -> Delta:
    """Interval of the % delta (independent resamples of both sides) and its verdict."""
    if candidate is None or baseline is None:
        return Delta(None, None, UNKNOWN, True)
    coarse = candidate.coarse or baseline.coarse
    if not (candidate.spread_known and baseline.spread_known):
        return Delta(None, None, UNKNOWN, coarse)  # a zero-width interval would be a lie
    deltas = delta_pct(candidate.values, baseline.values)
    bounds = interval(deltas, level=level)
    low, high = bounds if bounds else (None, None)
    return Delta(low, high, verdict(low=low, high=high, better=better), coarse, p_value(deltas))


# ---------------------------------------------------------------- method description

VERDICT_RULE = (
    "within noise if the bootstrap interval of the % delta contains 0, or if its p-value "
    "adjusted over the comparison's tests (multiplicity) is not below 5%; otherwise better or "
    "worse by the metric's direction (lower is better for latencies, higher for throughputs); "
    "unknown when a median is missing or a side has one repeat and no per-request data"
)
MULTIPLICITY = (
    "Benjamini-Hochberg false-discovery rate of 5% over every cell-metric test of one "
    "comparison (summary.json: every candidate cell against its baseline twin; a comparison "
    "of two runs: every common cell): each test's two-sided bootstrap p-value (twice the share "
    "of delta replicates on the smaller side of 0) is adjusted (p_adjusted), and better/worse "
    "needs an adjusted p-value below 5%, so among the better/worse verdicts of a comparison at "
    "most 5% are expected to be false. Intervals stay marginal 95% intervals: one that "
    "excludes 0 can still read within noise"
)
DIRECTION = (
    "delta_pct = 100 x (candidate - baseline) / baseline of the medians over repeats, so its "
    "sign is the sign of the raw change: for latencies negative is an improvement, for "
    "throughputs positive; the verdict already accounts for the direction"
)


def method(
    *,
    bootstrap: Bootstrap,
    repeats: Iterable[int],
    resampled: Mapping[str, str | None] | None = None,
) -> dict[str, Any]:
    """The `method` block of summary.json / comparison.json: what was done, and its limits.

    `repeats` are the repeat counts of the cells; `resampled` maps metric -> how it was
    resampled (`repeats+requests`, `repeats`, None) in the cells.
    """
    counts: dict[int, int] = {}
    for n in repeats:
        counts[n] = counts.get(n, 0) + 1
    level_pct = f"{100 * bootstrap.level:g}%"
    return {
        "statistic": (
            "per repeat: the record's figure (e.g. p99 of the repeat's request TTFTs); "
            "per cell: the median over repeats (median, min and max are of the record values)"
        ),
        "interval": f"percentile bootstrap, {level_pct}",
        "level": bootstrap.level,
        "replicates": bootstrap.replicates,
        "seed": bootstrap.seed,
        "seeding": (
            "one random stream per (seed, run, server id, client id, figure): output is "
            "deterministic and adding cells does not change the intervals of others"
        ),
        "resampling": {
            RESAMPLED_REQUESTS: (
                "repeats with replacement, then the successful requests of each drawn repeat "
                "with replacement; the repeat's figure is recomputed from the resampled requests"
            ),
            RESAMPLED_REPEATS: (
                "repeats with replacement only (record-level figures such as input throughput, "
                "or cells whose raw records have no per-request details)"
            ),
        },
        "resampled": dict(resampled or {}),
        "request_figures": {
            "ttft": "details.ttfts of the successful requests (empty error)",
            "e2e": "ttft + sum(itls) per request (a proxy: bench_serving's latency also waits "
            "for the end of the stream)",
            "tpot": "sum(itls) / (output_len - 1), requests with more than one output token",
        },
        "anchoring": (
            "each resampled per-repeat figure is shifted by (record value - the figure "
            "recomputed from that repeat's own requests), so intervals sit on the recorded "
            "values even where the per-request proxy differs from the record (E2E)"
        ),
        "delta": (
            "per replicate 100 x (candidate - baseline) / baseline, candidate and baseline "
            f"resampled independently; the interval is the {level_pct} percentile interval "
            "of those replicates"
        ),
        "direction": DIRECTION,
        "verdict_rule": VERDICT_RULE,
        "multiplicity": MULTIPLICITY,
        "verdicts": list(VERDICTS),
        "assumptions": [
            "requests are i.i.d. within a repeat (they share the server's queue, so at high "
            "concurrency neighbouring requests are correlated and request resampling "
            "understates within-repeat variance)",
            "repeats are i.i.d. draws of the same conditions",
        ],
        "limits": [
            "n repeats have only C(2n-1, n) distinct resamples (3 repeats: 10), so intervals "
            f"of cells with fewer than {COARSE_BELOW} (n <= 4) are flagged coarse; with 3 "
            "repeats and record-level figures the interval is about [min, max] over repeats",
            "percentile intervals are too narrow at small n: [min, max] of 3 repeats covers "
            "the median of the repeat distribution only 75% of the time (1 - 2 x 0.5^3), "
            f"not {level_pct}; for a delta between two cells of 3 repeats on a figure resampled "
            "over repeats only, better/worse means the two sets of 3 values do not overlap, "
            "which happens by chance in 2 of 20 orderings (10%) even when nothing changed",
            "repeats that run back to back on one server start cannot show run-to-run drift "
            "(another day, node or server start); compare whole runs for that",
            "one repeat gives no run-to-run spread: with per-request details its interval is "
            "request-level noise only; without them there is no interval and the verdict is "
            "unknown",
            "tail percentiles (p95, p99) of a few dozen requests rest on the slowest one or two",
        ],
        "coarse_below": COARSE_BELOW,
        "repeats": {
            str(n): {
                "cells": c,
                "distinct_repeat_resamples": distinct_resamples(n),
                "coarse": is_coarse(n),
            }
            for n, c in sorted(counts.items())
        },
    }
