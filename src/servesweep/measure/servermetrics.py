"""The server's side of a cell: every rank's `/metrics` recorded while the client runs
(metrics/<server>/<client>/r<k>.jsonl.gz) and the figures derived from it over the client's
measured window: load gauges (running, queued, KV usage, cache hit rate), per-stage request
latencies, and for PD where the time to first token went (docs/outputs.md).

The series file holds one JSON object a line: first a header (`{"header": {...}}`: interval,
targets, the measured window, notes such as an endpoint that has no /metrics), then one line
per scrape, `{"t", "n", "url", "role", "full"|"delta"}`: `t` the workflow host's clock at the
scrape's midpoint (the clock of the measured window, and of the GPU samples once aligned by
their node's offset); `n` the scrape round (every target is read once a round); `full` every
series of the first scrape of an endpoint, `delta` the series that changed since its last
scrape. The rehearsal's trace (docs/rehearsal/*/calls/1/metrics.jsonl.xz) has this form
without the header and `n`: `read_series` reads both."""

from __future__ import annotations

import gzip
import json
import logging
import lzma
import math
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servesweep.cluster import http, promtext
from servesweep.core.files import atomic_open

logger = logging.getLogger(__name__)

# The raw record's key of the derived figures (results.csv reads them from there).
KEY = "servesweep_server_metrics"
SCRAPE_TIMEOUT_S = 5.0
SIM_MIN_INTERVAL_S = 0.05  # the sim's interval scaled by its time scale, at least this

# Load gauges: results.csv `server_<name>_peak` and `server_<name>_mean` over the window. A
# round's value is the sum over the server set's ranks (requests) or their largest (fractions).
GAUGES: dict[str, tuple[str, str]] = {
    "running_reqs": ("sglang:num_running_reqs", "sum"),
    "queue_reqs": ("sglang:num_queue_reqs", "sum"),
    "kv_usage": ("sglang:token_usage", "max"),
    "cache_hit_rate": ("sglang:cache_hit_rate", "max"),
}
GAUGE_COLUMNS = tuple(f"server_{g}_{s}" for g in GAUGES for s in ("peak", "mean"))

STAGE_FAMILY = "sglang:per_stage_req_latency_seconds"
# Where a PD request's time to first token goes, from SGLang's RequestStage labels (each stage's
# latency is the time since the request's previous stage on that server): part -> (role,
# stages). `prealloc` runs on decode while prefill bootstraps, decode's `decode_transferred`
# (waiting for the KV cache) while prefill works: shown, not added up.
TTFT_PARTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "bootstrap": ("prefill", ("prefill_prepare", "prefill_bootstrap")),
    "queue": ("prefill", ("prefill_waiting",)),
    "prefill": ("prefill", ("prefill_forward", "chunked_prefill")),
    "transfer": ("prefill", ("prefill_transfer_kv_cache",)),
    "first_decode": ("decode", ("decode_waiting",)),
    "prealloc": ("decode", ("decode_prepare", "decode_bootstrap")),
}
TTFT_SUMMED = ("bootstrap", "queue", "prefill", "transfer", "first_decode")
TTFT_COLUMNS = (
    *(f"ttft_{p}_ms" for p in TTFT_PARTS),
    "ttft_breakdown_ms",
    "ttft_breakdown_error_pct",
)
COLUMNS = (*GAUGE_COLUMNS, "server_scrapes", *TTFT_COLUMNS)


# ------------------------------------------------------------------ recording


@dataclass
class MetricsRecorder:
    """Scrapes every target's `/metrics` once a round, every `interval_s`, from a thread of
    the cell's process; `start` and `stop` each scrape one round themselves (the histograms'
    state before the first request and after the last). An endpoint that answers 404 (e.g.
    sglang-router) is said once in the header's notes and not read again."""

    targets: Sequence[tuple[str, str]]  # (role, base URL)
    interval_s: float
    lines: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    scrape_s: float = 0.0  # seconds spent scraping (the cost, in the cell's process)

    def __post_init__(self) -> None:
        self._last: dict[str, dict[str, str]] = {}
        self._skip: set[str] = set()
        self._round = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="metrics-recorder", daemon=True)
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.interval_s > 0 and bool(self.targets)

    def scrape(self) -> None:
        """One round: every target once."""
        with self._lock:
            started = time.monotonic()
            for role, url in self.targets:
                if url in self._skip:
                    continue
                before = time.time()
                code, body = http.request(f"{url}/metrics", timeout=SCRAPE_TIMEOUT_S)
                at = (before + time.time()) / 2
                if code == 404:
                    self._skip.add(url)
                    self.notes.append(f"{role} {url}/metrics answers 404: not recorded")
                    continue
                if code != 200:
                    continue  # a missed scrape leaves a gap in the series
                sample = promtext.parse(body)
                line: dict[str, Any] = {"t": round(at, 4), "n": self._round, "url": url}
                line["role"] = role
                last = self._last.get(url)
                if last is None:
                    line["full"] = sample
                else:
                    line["delta"] = {k: v for k, v in sample.items() if last.get(k) != v}
                self._last[url] = sample
                self.lines.append(line)
            self._round += 1
            self.scrape_s += time.monotonic() - started

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.scrape()

    def start(self) -> None:
        if not self.enabled:
            return
        self.scrape()
        self._thread.start()

    def stop(self) -> list[dict[str, Any]]:
        if not self.enabled:
            return self.lines
        self._stop.set()
        self._thread.join(timeout=2 * SCRAPE_TIMEOUT_S * max(1, len(self.targets)))
        self.scrape()
        for note in self.notes:
            logger.info("/metrics: %s", note)
        return self.lines

    def header(self, window: tuple[float, float] | None) -> dict[str, Any]:
        return {
            "interval_s": self.interval_s,
            "targets": [{"role": r, "url": u} for r, u in self.targets],
            "window": list(window) if window else None,
            "notes": self.notes,
            "scrape_s": round(self.scrape_s, 4),
            "clock": "workflow host, epoch seconds (the measured window's clock)",
        }


def write_series(path: str | Path, header: Mapping[str, Any], lines: Iterable[Mapping]) -> None:
    """The series file, gzip-compressed, atomically."""
    with atomic_open(path, "wb") as fh, gzip.GzipFile(fileobj=fh, mode="wb", mtime=0) as gz:
        gz.write((json.dumps({"header": header}) + "\n").encode())
        for line in lines:
            gz.write((json.dumps(line, separators=(",", ":")) + "\n").encode())


# ------------------------------------------------------------------ reading


@dataclass(frozen=True)
class Scrape:
    """One scrape round: when, and every endpoint's series as last read (role, sample)."""

    t: float
    endpoints: dict[str, tuple[str, dict[str, str]]]


def read_lines(path: str | Path) -> list[dict[str, Any]]:
    """The JSON lines of a series file (.gz, .xz or plain)."""
    path = Path(path)
    opener = {".gz": gzip.open, ".xz": lzma.open}.get(path.suffix, open)
    with opener(path, "rt") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def read_series(lines: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Any], list[Scrape]]:
    """(header, scrape rounds in time order) of a series file's lines: each round carries every
    endpoint's series as known at its time (an endpoint's `delta` applied to its last state).
    Lines without `n` are a round each (the rehearsal's trace)."""
    header: dict[str, Any] = {}
    state: dict[str, tuple[str, dict[str, str]]] = {}
    rounds: list[Scrape] = []
    last_n: Any = object()
    for index, line in enumerate(lines):
        if "header" in line:
            header = dict(line["header"])
            continue
        url = str(line.get("url", ""))
        role = str(line.get("role", ""))
        if "full" in line:
            state[url] = (role, dict(line["full"]))
        else:
            state.setdefault(url, (role, {}))[1].update(line.get("delta") or {})
        n = line.get("n", f"line{index}")
        snapshot = {u: (r, dict(s)) for u, (r, s) in state.items()}
        if rounds and n == last_n:
            rounds[-1] = Scrape(t=rounds[-1].t, endpoints=snapshot)
        else:
            rounds.append(Scrape(t=float(line["t"]), endpoints=snapshot))
        last_n = n
    return header, rounds


# ------------------------------------------------------------------ deriving


def gauge_series(
    rounds: Sequence[Scrape], window: tuple[float, float] | None
) -> dict[str, list[tuple[float, float]]]:
    """Each GAUGES as (time, value) over the rounds inside `window` (all without one), a
    round's value over the server set's ranks as GAUGES says."""
    inside = [s for s in rounds if window is None or window[0] <= s.t <= window[1]]
    out: dict[str, list[tuple[float, float]]] = {}
    for name, (fam, how) in GAUGES.items():
        out[name] = []
        for s in inside:
            found = [promtext.total(sample, fam) for _, sample in s.endpoints.values()]
            found = [v for v in found if not math.isnan(v)]
            if found:
                out[name].append((s.t, sum(found) if how == "sum" else max(found)))
    return out


def gauge_figures(rounds: Sequence[Scrape], window: tuple[float, float] | None) -> dict[str, float]:
    """Peak and mean of each GAUGES over the rounds inside `window` (all rounds without one)."""
    inside = [s for s in rounds if window is None or window[0] <= s.t <= window[1]]
    out: dict[str, float] = {"server_scrapes": float(len(inside))}
    for name, points in gauge_series(rounds, window).items():
        series = [v for _, v in points]
        out[f"server_{name}_peak"] = max(series) if series else math.nan
        out[f"server_{name}_mean"] = sum(series) / len(series) if series else math.nan
    return out


def window_series(
    path: str | Path,
) -> tuple[tuple[float, float] | None, dict[str, list[tuple[float, float]]]]:
    """A series file's measured window and its GAUGES inside it (gauge_series)."""
    header, rounds = read_series(read_lines(path))
    found = header.get("window")
    window = (float(found[0]), float(found[1])) if found else None
    return window, gauge_series(rounds, window)


def _histograms(sample: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Per stage: sum, count and cumulative buckets {le: count} of STAGE_FAMILY."""
    found: dict[str, dict[str, Any]] = {}
    for key, value in sample.items():
        fam = promtext.family(key)
        if not fam.startswith(STAGE_FAMILY):
            continue
        part = fam[len(STAGE_FAMILY) :]
        labels = promtext.labels(key)
        entry = found.setdefault(labels.get("stage", ""), {"sum": 0.0, "count": 0.0, "le": {}})
        if part == "_sum":
            entry["sum"] += promtext.number(value)
        elif part == "_count":
            entry["count"] += promtext.number(value)
        elif part == "_bucket":
            le = promtext.number(labels.get("le", "nan"))
            entry["le"][le] = entry["le"].get(le, 0.0) + promtext.number(value)
    return found


def quantile(buckets: Mapping[float, float], q: float) -> float:
    """Prometheus' histogram_quantile: linear inside the bucket holding rank q x count."""
    edges = sorted(buckets)
    if not edges or buckets[edges[-1]] <= 0:
        return math.nan
    rank = q * buckets[edges[-1]]
    lower, below = 0.0, 0.0
    for le in edges:
        if buckets[le] >= rank:
            if math.isinf(le):
                return lower
            inside = buckets[le] - below
            return lower + (le - lower) * ((rank - below) / inside if inside else 0.0)
        lower, below = le, buckets[le]
    return lower


def stage_latencies(rounds: Sequence[Scrape]) -> dict[str, dict[str, dict[str, float]]]:
    """Per role and stage: requests, mean, p50 and p99 latency (ms) of STAGE_FAMILY between
    the first and the last round (the recorder reads one before the client's first request and
    one after its last)."""
    if not rounds:
        return {}
    first, last = rounds[0].endpoints, rounds[-1].endpoints
    out: dict[str, dict[str, dict[str, float]]] = {}
    for url, (role, sample) in last.items():
        before = _histograms(first.get(url, (role, {}))[1])
        for stage, end in _histograms(sample).items():
            start = before.get(stage, {"sum": 0.0, "count": 0.0, "le": {}})
            count = end["count"] - start["count"]
            if count <= 0:
                continue
            buckets = {le: n - start["le"].get(le, 0.0) for le, n in end["le"].items()}
            out.setdefault(role, {})[stage] = {
                "requests": count,
                "mean_ms": 1000 * (end["sum"] - start["sum"]) / count,
                "p50_ms": 1000 * quantile(buckets, 0.5),
                "p99_ms": 1000 * quantile(buckets, 0.99),
            }
    return out


def ttft_breakdown(
    stages: Mapping[str, Mapping[str, Mapping[str, float]]], *, client_ttft_ms: float | None
) -> dict[str, float]:
    """The mean time to first token split into TTFT_PARTS (ms); NaN everywhere unless the
    server set has PD stages. `ttft_breakdown_ms` adds TTFT_SUMMED; its error is
    (breakdown - client's mean TTFT) / client's mean TTFT in % (what it leaves out: the
    router, the HTTP and tokenizer hops, the first decode forward)."""
    out = dict.fromkeys(TTFT_COLUMNS, math.nan)
    if "prefill_transfer_kv_cache" not in stages.get("prefill", {}):
        return out
    for part, (role, names) in TTFT_PARTS.items():
        found = [stages.get(role, {}).get(s, {}).get("mean_ms") for s in names]
        out[f"ttft_{part}_ms"] = math.fsum(v for v in found if v is not None)
    out["ttft_breakdown_ms"] = math.fsum(out[f"ttft_{p}_ms"] for p in TTFT_SUMMED)
    if client_ttft_ms:
        out["ttft_breakdown_error_pct"] = (
            100 * (out["ttft_breakdown_ms"] - client_ttft_ms) / client_ttft_ms
        )
    return out


def derive(
    lines: Sequence[Mapping[str, Any]],
    *,
    window: tuple[float, float] | None = None,
    client_ttft_ms: float | None = None,
) -> dict[str, Any]:
    """A cell's server figures from its series' lines: those of COLUMNS it has (none that is
    not finite: the raw record stays free of NaN) and `stages` (per role and stage).
    `window` defaults to the header's."""
    header, rounds = read_series(lines)
    if window is None and header.get("window"):
        window = (float(header["window"][0]), float(header["window"][1]))
    stages = stage_latencies(rounds)
    figures = {
        **gauge_figures(rounds, window),
        **ttft_breakdown(stages, client_ttft_ms=client_ttft_ms),
    }
    return {
        **{k: v for k, v in figures.items() if math.isfinite(v)},
        "stages": {
            role: {s: {k: v for k, v in f.items() if math.isfinite(v)} for s, f in found.items()}
            for role, found in stages.items()
        },
    }


def columns(figures: Mapping[str, Any] | None) -> dict[str, float]:
    """results.csv's COLUMNS from a record's KEY (NaN where it has none)."""
    figures = figures or {}
    return {c: float(figures.get(c, math.nan)) for c in COLUMNS}
