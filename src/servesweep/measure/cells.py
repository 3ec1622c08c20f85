"""One cell-repeat: ensure its server, snapshot GPUs, run the client, validate, write files."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import math
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from servesweep.cluster import clocks, gpusampling, http, telemetry
from servesweep.config.experiment import Experiment
from servesweep.config.matrix import CellRepeat, ServerSpec, client_specs, derived_seed
from servesweep.config.paths import RunPaths
from servesweep.core import gpufile
from servesweep.core.errors import (
    CellFailed,
    ClientError,
    PreflightFailed,
    ServerDied,
    ServesweepError,
    Terminated,
    TransportError,
)
from servesweep.core.files import keep_failed_copy
from servesweep.measure import isolation, provenance, servermetrics, validation
from servesweep.measure.client import (
    CLOCK_KEY,
    REQUESTS_KEY,
    client_timeout,
    run_client,
)
from servesweep.measure.loadgen import selfcheck, usage
from servesweep.measure.records import EVIDENCE_KEY, START_KEY, BenchRecord, write_record
from servesweep.serving import evidence
from servesweep.serving.engines import ROUTER_ROLE
from servesweep.serving.servers import ServerManager
from servesweep.serving.state import ServerState

logger = logging.getLogger(__name__)

SNAPSHOT_TIMEOUT_S = 60.0


# What measured a raw record: {kind, simulated, time_scale} (a sim's times are wall-clock times
# of a clock running time_scale x wall time).
ENGINE_KEY = "servesweep_engine"


def engine_label(exp: Experiment) -> dict[str, Any]:
    """ENGINE_KEY of the records of `exp`."""
    sim = exp.engine.kind == "sim"
    return {
        "kind": exp.engine.kind,
        "simulated": sim,
        "time_scale": exp.engine.sim.time_scale if sim else None,
    }


def server_logs(manager: ServerManager, state: ServerState) -> list[str]:
    """Local copies of every process log of a server set."""
    return [str(manager.local_log_path(state.server_id, r.role, r.node)) for r in state.ranks]


def flush_radix_cache(
    *, server: ServerSpec, tag: str, manager: ServerManager, state: ServerState
) -> bool:
    """Before a cell's client (`tag` its key), or after the equivalence probe: flush the radix
    cache of every role that keeps one (SGLang's `/flush_cache` on the role's entry point), so
    no cell reuses another's prefixes; True if it flushed (recorded in results.csv
    `cache_flushed`), False when every role runs with `disable_radix_cache`."""
    cached = {r.name for r in server.roles if not r.args.disable_radix_cache}
    urls = [r.url for r in state.ranks if r.url and r.role in cached and r.role != ROUTER_ROLE]
    if not urls:
        return False
    isolation.flush_cache(urls=urls, server=state.server_id, cell=tag, key=manager.api_key(state))
    manager.events.emit("flush-cache", cell=tag, roles=",".join(sorted(cached)))
    return True


def rank_logs(
    manager: ServerManager, state: ServerState, roles: set[str]
) -> list[evidence.RankLog]:
    """The logs of a server set's processes in `roles`, each read on demand (its node)."""
    return [
        evidence.RankLog(
            role=r.role,
            read=functools.partial(manager.runtime.logs, r.node, r.handle, r.log_path),
            path=str(manager.local_log_path(state.server_id, r.role, r.node)),
        )
        for r in state.ranks
        if r.role in roles
    ]


def node_gpus(exp: Experiment, node: str) -> list[int]:
    """The host GPU indices a node has: its `cluster.gpu_ids`, else 0..gpus_per_node-1."""
    return exp.cluster.host_gpus(node)


def gpu_nodes(exp: Experiment) -> list[str]:
    """The nodes whose GPUs a cell reads: every node but one whose GPUs are all an earlier
    node's (a GPU that prefill and decode share is read once, under its first node)."""
    return [n for n in exp.cluster.nodes if exp.cluster.telemetry_gpus(n) != []]


def gpu_sampler(
    *, exp: Experiment, manager: ServerManager, state: ServerState, cell: CellRepeat
) -> gpusampling.NvidiaSmiSampler | gpusampling.SimulatedSampler:
    """The cell's GPU sampler: the sim's curve for the sim on this machine (no GPU does its
    work; each node follows the load of its role's rank 0, a GPU that roles share the load of
    each), else an nvidia-smi loop on every node of gpu_nodes."""
    interval_ms = exp.telemetry.gpu_interval_ms
    tag = cell.key
    nodes = gpu_nodes(exp)
    if exp.engine.kind == "sim" and exp.cluster.local:
        urls = {r.role: r.url for r in state.ranks if r.url and r.role != ROUTER_ROLE}
        role_url: dict[str, str | None] = dict.fromkeys(exp.cluster.nodes)
        for role in cell.server.roles:
            for node in role.nodes:
                role_url[node] = role_url[node] or urls.get(role.name)
        loads = {
            node: [u for n in exp.cluster.gpu_sharers(node) if (u := role_url[n])] for node in nodes
        }
        return gpusampling.SimulatedSampler(
            loads=loads,
            gpus={node: exp.cluster.telemetry_gpus(node) or node_gpus(exp, node) for node in nodes},
            interval_s=interval_ms / 1000 * exp.engine.sim.time_scale,
            headers=http.auth_headers(manager.api_key(state)),
        )
    digest = hashlib.sha256(tag.encode()).hexdigest()[:12]
    return gpusampling.NvidiaSmiSampler(
        transport=manager.transport,
        nodes=nodes,
        interval_ms=interval_ms,
        remote_dir=f"{manager.node_dir()}/gpu/{digest}",
        max_s=math.ceil(client_timeout(cell.client.workload) + 2 * SNAPSHOT_TIMEOUT_S),
    )


def metrics_recorder(*, exp: Experiment, state: ServerState) -> servermetrics.MetricsRecorder:
    """The cell's /metrics recorder: every rank with an HTTP endpoint (the router's too), every
    `telemetry.metrics_interval_s` (the sim's: x its time scale, as its GPU curve)."""
    interval = exp.telemetry.metrics_interval_s
    if interval and exp.engine.kind == "sim":
        interval = max(servermetrics.SIM_MIN_INTERVAL_S, interval * exp.engine.sim.time_scale)
    targets = [(r.role, r.url) for r in state.ranks if r.url]
    return servermetrics.MetricsRecorder(targets=targets, interval_s=interval)


def warn_gpu_gaps(rows: list[dict[str, object]], *, paths: RunPaths, cell: str) -> None:
    """Say once per run, node and reason that a node's GPU figures are unavailable (e.g.
    nvidia-smi not found): a warning in the first cell's log, kept in RunPaths.gpu_gap.
    Every cell's gpu/*.csv keeps its `unavailable` rows. A node the sim's curve covers (its
    samples `simulated`) has its figures: its snapshots' gap (no nvidia-smi) is no warning."""
    simulated = {str(r["node"]) for r in rows if r.get("status") == gpufile.STATUS_SIMULATED}
    gaps = {
        (str(r["node"]), str(r["detail"]))
        for r in rows
        if r.get("status") == gpufile.STATUS_UNAVAILABLE and str(r["node"]) not in simulated
    }
    for node, detail in sorted(gaps):
        marker = paths.gpu_gap(node, detail)
        marker.parent.mkdir(parents=True, exist_ok=True)
        line = f"GPU figures unavailable: {detail} (said once per node per run; first in {cell})"
        try:
            fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
        logger.warning("%s", line)


def run_warmup(
    *, exp: Experiment, server: ServerSpec, manager: ServerManager, state: ServerState
) -> None:
    """The first request(s) after a start, recorded apart from the figures
    (service/<server>/warmup.jsonl): e.g. RDMA endpoint setup inflates the first TTFT. They
    have the shape (lengths, streaming) of the first listed case or client config, whichever
    job (a cell, the equivalence probe) triggered the start, so that case's first row never
    carries the setup cost."""
    service = manager.paths.service(server.id)
    shape = client_specs(exp)[0]
    workload = shape.workload.model_copy(
        update={
            "num_requests": exp.warmup_after_start,
            "concurrency": 1,
            "warmup_requests": 0,
            # Its own prompts: a flushed or disabled radix cache keeps none for the cells.
            "seed": derived_seed(shape.workload.seed, "warmup"),
        }
    )
    log = service / "warmup.log"
    started = time.monotonic()
    record = run_client(
        exp=exp,
        manager=manager,
        state=state,
        workload=workload,
        tag=f"{server.id}/warmup",
        bench_log=log,
    )
    validation.check_record(
        record,
        workload,
        cell=f"{server.id}/warmup",
        logs=[str(log), *server_logs(manager, state)],
        min_retokenized_ratio=exp.validation.min_retokenized_ratio,
    )
    write_record(service / "warmup.jsonl", record)
    manager.events.emit(
        "warmup",
        fp=server.fingerprint,
        server=server.id,
        shape=shape.id,
        ttft_ms=f"{record.mean_ttft_ms:.1f}",
        seconds=f"{time.monotonic() - started:.2f}",
    )


def check_prerequisites(*, exp: Experiment, paths: RunPaths, cell: str) -> None:
    """Image and preflight evidence must exist before a server starts. On a fresh run they are
    inputs of every cell; later the workflow runs them first by priority (rules/common.smk),
    which a cell targeted alone after they were deleted does not get."""
    missing = [str(p) for p in paths.prerequisites(exp) if not p.exists()]
    if missing:
        raise PreflightFailed(
            f"evidence missing: {', '.join(missing)}; run `snakemake --cores 1 "
            f"{paths.preflight}` with this run's --configfile and env (checks images, then "
            f"preflight), or the `all` target",
            cell=cell,
        )


def run_cell(
    *,
    exp: Experiment,
    cell: CellRepeat,
    manager: ServerManager,
    raw: Path,
    gpu: Path,
    bench_log: Path,
    metrics: Path | None = None,
) -> None:
    """Run one cell-repeat end to end, writing its raw record, GPU snapshot, /metrics series
    and bench log; files appear only if everything passed.

    Every error names the cell; a failed client is blamed on its server when that died; files
    this call wrote are removed again if a later step fails (nothing looks finished)."""
    raw_out, gpu_out = raw, gpu
    events = manager.events
    started = time.monotonic()
    written: list[Path] = []
    client_ran = False  # the bench log holds this attempt (else another's, or none)
    try:
        # Inside: a full disk while logging the event is an error naming the cell too.
        events.emit("cell-start", cell=cell.key, fp=cell.server.fingerprint, pool=manager.pool)
        state, fresh = manager.ensure(cell.server)
        if fresh and exp.warmup_after_start:
            run_warmup(exp=exp, server=cell.server, manager=manager, state=state)
        flushed = flush_radix_cache(server=cell.server, tag=cell.key, manager=manager, state=state)
        logs = rank_logs(manager, state, {p.role for p in exp.evidence.values()})
        marks = evidence.count(exp.evidence, logs)
        client_started = time.monotonic()
        with gpu_window(exp=exp, manager=manager, state=state, cell=cell) as window:
            client_ran = True
            record = _client_record(
                exp=exp, manager=manager, state=state, cell=cell, bench_log=bench_log
            )
            window.client_returned(record)
        client_seconds = time.monotonic() - client_started
        # A non-streamed request's TTFT is its whole latency: no breakdown error stated.
        server_figures = servermetrics.derive(
            [{"header": window.series_header}, *window.scrapes],
            client_ttft_ms=record.mean_ttft_ms if cell.workload.stream else None,
        )
        manager.check_alive(state)
        counts = _validate(
            exp=exp,
            manager=manager,
            state=state,
            cell=cell,
            record=record,
            bench_log=bench_log,
            logs=logs,
            marks=marks,
        )
        # A node that is a slice of its host keeps only its own GPUs' rows (cluster.gpu_ids),
        # a GPU that two nodes share is kept under the first one only.
        snapshot = telemetry.visible_rows(
            window.rows(), {node: exp.cluster.telemetry_gpus(node) for node in exp.cluster.nodes}
        )
        warn_gpu_gaps(snapshot, paths=manager.paths, cell=cell.key)
        record = BenchRecord.model_validate(
            {
                **record.model_dump(),
                provenance.KEY: provenance.measured_with(exp, cell),
                EVIDENCE_KEY: counts,
                isolation.CACHE_FLUSHED_KEY: flushed,
                ENGINE_KEY: engine_label(exp),
                START_KEY: state.start_phases,
                servermetrics.KEY: server_figures,
            }
        )
        if metrics is not None:
            header, scrapes = window.series_header, window.scrapes
            _write(metrics, lambda: servermetrics.write_series(metrics, header, scrapes), written)
        _write(gpu_out, lambda: gpufile.write_snapshot(gpu_out, snapshot), written)
        _write(raw_out, lambda: write_record(raw_out, record), written)
        # Inside too: a full disk while logging it removes the files and names the cell.
        events.emit(
            "cell-done",
            cell=cell.key,
            fp=cell.server.fingerprint,
            seconds=f"{time.monotonic() - started:.2f}",
            client_seconds=f"{client_seconds:.2f}",
            measured_seconds=f"{record.duration or 0.0:.2f}",  # the client's window (plan)
        )
    except BaseException as exc:
        for path in written:
            path.unlink(missing_ok=True)
        # The attempt's bench log under its own name: a rerun of the cell writes bench_log
        # again. Before the client ran, the bench log is another attempt's: the job's log.
        kept = _keep_attempt_log(bench_log) if client_ran else None
        log = ("bench log", kept) if kept else ("job log", manager.paths.job_log(cell))
        failure = _naming_cell(
            exc, cell=cell.key, node=exp.cluster.nodes[0], bench_log=bench_log, log=log
        )
        shown = failure if failure is not None else exc
        try:
            events.emit(
                "cell-failed",
                cell=cell.key,
                fp=cell.server.fingerprint,
                error=(str(shown).splitlines() or [type(exc).__name__])[0],
            )
        except OSError as emit_exc:  # e.g. the disk is full: the cell's own error matters more
            logger.warning("cell %s: could not log cell-failed: %s", cell.key, emit_exc)
        if failure is not None and failure is not exc:
            raise failure from exc
        raise


class GpuWindow:
    """A cell's measured window, GPU and server side, around its client: the before snapshot
    and every node's clock (taken on entering gpu_window), the loop samples and the servers'
    /metrics reads while the client runs, then the measured window (from the client's record),
    the series' header for it and the after snapshot."""

    def __init__(self, before: list[dict[str, Any]], clock: list[dict[str, Any]]) -> None:
        self.before, self.clock = before, clock
        self.samples: list[dict[str, Any]] = []
        self.scrapes: list[dict[str, Any]] = []
        self.series_header: dict[str, Any] = {}
        self.window: list[dict[str, Any]] = []
        self.after: list[dict[str, Any]] = []
        self.record: BenchRecord | None = None
        self.returned_at = 0.0

    def client_returned(self, record: BenchRecord) -> None:
        """The client's record, and when it returned here (this host's clock)."""
        self.record, self.returned_at = record, time.time()

    def rows(self) -> list[dict[str, Any]]:
        """In time order, the after rows last: a file cut at any line loses some of them, so
        a cut file is `incomplete` (its before and after rows do not pair up), never `ok`."""
        return self.before + self.clock + self.window + self.samples + self.after


@contextlib.contextmanager
def gpu_window(
    *, exp: Experiment, manager: ServerManager, state: ServerState, cell: CellRepeat
) -> Iterator[GpuWindow]:
    """Snapshot the GPUs and read each node's clock, sample the GPUs and record the servers'
    /metrics while the body runs the client; after a body that gave the client's record
    (GpuWindow.client_returned), place its measured window and snapshot the GPUs again. A GPU
    that roles share is read once (cluster.gpu_ids)."""
    read = gpu_nodes(exp)
    before = telemetry.take_snapshot(
        transport=manager.transport, nodes=read, phase="before", timeout=SNAPSHOT_TIMEOUT_S
    )
    # Each node's clock against this host's: the window below is in this host's clock.
    clock = clocks.clock_rows(transport=manager.transport, nodes=exp.cluster.nodes)
    clocks.warn_offsets(clock, interval_s=exp.telemetry.gpu_interval_ms / 1000, cell=cell.key)
    window = GpuWindow(before, clock)
    sampler = gpu_sampler(exp=exp, manager=manager, state=state, cell=cell)
    recorder = metrics_recorder(exp=exp, state=state)
    recorder.start()
    sampler.start()
    try:
        yield window
    finally:
        window.samples = sampler.stop()
        window.scrapes = recorder.stop()
    record = window.record
    if record is None:
        raise RuntimeError("gpu_window: its body gave no client record (client_returned)")
    # The client's clock stops at its last response (its `duration`); the window ends when
    # it wrote its record (bench_serving exits ~1.8 s later), else when it returned here.
    written_at = ((record.model_extra or {}).get(CLOCK_KEY) or {}).get("record_written_at")
    # `date -r` on the client's node gives its clock: back to this host's by its offset
    # (a clock not read has none: then the end is when the client returned here).
    client_node = exp.cluster.nodes[0]
    offset = next((r.get("clock_offset_s") for r in clock if r["node"] == client_node), None)
    end = written_at - offset if written_at and offset is not None else window.returned_at
    window.window = gpusampling.window_rows(end - (record.duration or 0.0), end)
    window.series_header = recorder.header((end - (record.duration or 0.0), end))
    window.after = telemetry.take_snapshot(
        transport=manager.transport, nodes=read, phase="after", timeout=SNAPSHOT_TIMEOUT_S
    )


def _client_record(
    *,
    exp: Experiment,
    manager: ServerManager,
    state: ServerState,
    cell: CellRepeat,
    bench_log: Path,
) -> BenchRecord:
    """The cell's client run; a failed client is blamed on its server when that died."""
    try:
        return run_client(
            exp=exp,
            manager=manager,
            state=state,
            workload=cell.workload,
            tag=cell.key,
            bench_log=bench_log,
        )
    except (ClientError, TransportError, Terminated) as exc:
        # A client killed with its server (a Slurm allocation cancelled or out of time takes
        # both steps) is the server's death, with what Slurm says; a client stopped while its
        # server lives (Ctrl-C, SIGTERM to the run) stays the interruption.
        cause = _server_cause(manager, state)
        if cause is None:
            raise
        raise cause from exc


def _validate(
    *,
    exp: Experiment,
    manager: ServerManager,
    state: ServerState,
    cell: CellRepeat,
    record: BenchRecord,
    bench_log: Path,
    logs: list[evidence.RankLog],
    marks: dict[str, int],
) -> dict[str, int]:
    """The record's checks (validation, the client's saturation, the log evidence since
    `marks`, the server's request count); returns the cell's evidence counts."""
    validation.check_record(
        record,
        cell.workload,
        cell=cell.key,
        logs=[str(bench_log), *server_logs(manager, state)],
        node=exp.cluster.nodes[0],
        min_retokenized_ratio=exp.validation.min_retokenized_ratio,
    )
    _check_client(exp=exp, record=record, cell=cell.key, bench_log=bench_log)
    counts = evidence.cell_counts(
        exp.evidence, before=marks, after=evidence.count(exp.evidence, logs)
    )
    required = evidence.enforced(exp.evidence, exp.guesses)
    observed = {k: p for k, p in exp.evidence.items() if k not in required}
    for short in evidence.shortfalls(observed, counts):
        logger.warning("cell %s: guessed evidence, observed only: %s", cell.key, short)
    evidence.check(required, counts, cell=cell.key, logs=logs)
    _check_requests(exp=exp, manager=manager, record=record, cell=cell.key, state=state)
    return counts


def _check_client(*, exp: Experiment, record: BenchRecord, cell: str, bench_log: Path) -> None:
    """Warn when the client was saturated (selfcheck.saturated: the builtin's self-check, else
    the whole-process CPU from outside; results.csv flags the cell); with
    `client.saturation.invalid` the cell fails instead."""
    limits = exp.client.saturation
    extra = record.model_extra or {}
    figures = {**extra, **usage.columns(extra.get(usage.RECORD_KEY))}
    if not selfcheck.saturated(
        figures, loop_lag_p99_ms=limits.loop_lag_p99_ms, cpu_pct=limits.cpu_pct
    ):
        return
    if selfcheck.has_selfcheck(figures):
        why = (
            f"event-loop lag p99 {extra.get('client_loop_lag_p99_ms', math.nan):.1f} ms, limit "
            f"{limits.loop_lag_p99_ms:g}; CPU {extra.get('client_cpu_pct', math.nan):.0f}% of a "
            f"core, limit {limits.cpu_pct:g}"
        )
    else:
        why = (
            f"whole-process CPU {figures[usage.CPU_PCT_COLUMN]:.0f}% of a core, limit "
            f"{limits.cpu_pct:g}"
        )
    error = ClientError(f"client saturated ({why})", cell=cell, log=f"bench log {bench_log}")
    if limits.invalid:
        raise error
    logger.warning("%s", error)


def _check_requests(
    *, exp: Experiment, manager: ServerManager, record: BenchRecord, cell: str, state: ServerState
) -> None:
    """Requests the server counted beyond the client's (someone else's in the measurement):
    an event and a warning; with `validation.foreign_requests_invalid` the cell fails."""
    count = (record.model_extra or {}).get(REQUESTS_KEY) or {}
    extra = count.get("difference")
    if not extra:
        return
    if extra < 0:  # fewer than sent: a request the server never finished (the record says so)
        logger.warning("cell %s: the server counted %+d request(s) vs the client", cell, extra)
        return
    manager.events.emit(
        "foreign-requests", cell=cell, server=state.server_id, client=count.get("client"),
        counted=count.get("server"), difference=extra,
    )  # fmt: skip
    node = state.ranks[0].node if state.ranks else "?"
    error = CellFailed(
        f"server {state.server_id} on node {node} counted {count.get('server')} "
        f"request(s) during "
        f"the client's run, the client sent {count.get('client')} (difference {extra:+d}, "
        f"from {', '.join(count.get('sources') or [])}): someone else's requests are in the "
        f"measurement",
        cell=cell,
    )
    if exp.validation.foreign_requests_invalid:
        raise error
    logger.warning("%s", error)


def _write(path: Path, write: Callable[[], None], written: list[Path]) -> None:
    """Write one output file (atomically, by `write`); an OSError names the file."""
    try:
        write()
    except OSError as exc:
        raise OSError(exc.errno, f"cannot write {path}: {exc.strerror or exc}") from exc
    written.append(path)


def _server_cause(manager: ServerManager, state: ServerState) -> ServesweepError | None:
    """After a failed client: the server's death or fatal log line, if that is the cause."""
    try:
        manager.check_alive(state)
    except ServerDied as exc:
        return exc
    except TransportError as exc:  # the node cannot be asked either: keep the client's error
        logger.warning("could not check the server after a failed client: %s", exc)
    return None


def _keep_attempt_log(bench_log: Path) -> Path | None:
    """A copy of a failed attempt's bench log (core.files.keep_failed_copy); None where the
    client left none or the copy fails (the cell's own error matters more)."""
    try:
        return keep_failed_copy(bench_log)
    except OSError as exc:
        logger.warning("bench log %s: not kept as the failed attempt's: %s", bench_log, exc)
        return None


def _naming_cell(
    exc: BaseException, *, cell: str, node: str, bench_log: Path, log: tuple[str, Path]
) -> BaseException | None:
    """`exc` with its cell and its log (`log`: what, path) as fields where it has none: the
    log that holds this attempt, in place of `bench_log`, which a rerun writes again; None
    leaves a non-error exception as is.

    OSError (disk full, permissions) counts as an error of the workflow host; Ctrl-C names the
    cell it interrupted."""
    named_log = f"{log[0]} {log[1]}"
    if isinstance(exc, ServesweepError):
        # its fields: the cell where it has none, `log` where it names none; a bench log it
        # names is this attempt's kept copy
        moved = (str(bench_log), str(log[1])) if log[0] == "bench log" else None
        what = exc.what.replace(*moved) if moved else exc.what
        named = exc.log.replace(*moved) if exc.log and moved else exc.log
        return exc.with_context(what=what, cell=cell, log=named or named_log)
    if isinstance(exc, OSError):
        return OSError(
            exc.errno, f"cell {cell}: {exc.strerror or exc} on the workflow host; {named_log}"
        )
    if isinstance(exc, Terminated):
        why = " (hang-up: the session dropped)" if exc.signum == signal.SIGHUP else ""
        return Terminated(f"cell {cell} {exc}{why}; client on node {node}; {named_log}", exc.signum)
    if isinstance(exc, KeyboardInterrupt):
        return KeyboardInterrupt(
            f"cell {cell} interrupted by SIGINT (Ctrl-C); client on node {node}; {named_log}"
        )
    return None
