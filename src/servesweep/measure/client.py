"""One cell's client on the client node: its launch under the usage wrapper, measured alone on an
idle server, its record fetched back with the server's own request count."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import os
import shlex
import signal
from collections.abc import Callable
from pathlib import Path

from servesweep.cluster.owner import POOL_LABEL
from servesweep.cluster.runtime import Launch
from servesweep.cluster.secrets import Secret, scrub
from servesweep.config.experiment import Experiment
from servesweep.config.schema import Workload
from servesweep.core.errors import (
    ClientError,
    Terminated,
    TransportError,
)
from servesweep.core.events import EventLog
from servesweep.measure import isolation, loadgen
from servesweep.measure.loadgen import usage
from servesweep.measure.records import BenchRecord, read_record
from servesweep.serving.engines import ROUTER_ROLE
from servesweep.serving.servers import ServerManager
from servesweep.serving.state import ServerState
from servesweep.serving.watchdog import Watchdog

logger = logging.getLogger(__name__)

CLIENT_SLACK_S = 600.0


def client_timeout(workload: Workload) -> float:
    """Upper bound for one client invocation (requests run in waves of `concurrency`)."""
    waves = math.ceil(workload.num_requests / workload.concurrency) + workload.warmup_requests
    return waves * workload.request_timeout_s + CLIENT_SLACK_S


def run_client(
    *,
    exp: Experiment,
    manager: ServerManager,
    state: ServerState,
    workload: Workload,
    tag: str,
    bench_log: Path,
) -> BenchRecord:
    """Run the configured client on the client node (in the runtime); return its record."""
    node = exp.cluster.nodes[0]
    key = manager.api_key(state)
    # Per job: a stale job of the same cell (its Snakemake killed) never removes this one's file.
    local_out = bench_log.with_name(f".{bench_log.stem}.{os.getpid()}.client.jsonl")
    remove_partial_client_files(bench_log, events=manager.events, cell=tag)
    direct = manager.cluster.shares_run_folder
    node_out, node_log = client_files(manager, bench_log=bench_log, tag=tag, pid=os.getpid())
    if direct:
        # Made 0600 before the client appends to it (both clients open it with "a"): the
        # record holds /server_info with the API key. On a node it lies in the owner's 0700
        # directory, whoever writes it (a container's root), and comes back 0600.
        private_file(local_out)
    else:
        manager.transport.run(node, f"rm -f {shlex.quote(node_out)}", timeout=60)
    launch = client_launch(
        exp=exp,
        manager=manager,
        base_url=state.base_url,
        workload=workload,
        tag=tag,
        output_file=node_out,
        log_path=node_log,
        key=key,
    )
    bench_log.parent.mkdir(parents=True, exist_ok=True)
    alone = measured_alone(exp=exp, manager=manager, state=state, tag=tag)
    counters = isolation.request_counters(_entry_urls(state), key=key)
    labels = client_labels(exp=exp, manager=manager)
    watchdog = Watchdog(
        health_url=f"{state.base_url}/health",
        metric_urls=[r.url for r in state.ranks if r.url] or [state.base_url],
        server=state.server_id,
        node=state.ranks[0].node if state.ranks else node,
        cell=tag,
        window_s=exp.validation.stall_timeout_s,
        abort=lambda: isolation.stop_clients(runtime=manager.runtime, node=node, labels=labels),
    )
    try:
        try:
            with watchdog:
                try:
                    result = manager.runtime.run_oneshot(launch, timeout=client_timeout(workload))
                except BaseException:
                    _stop_left_client(manager, node=node, labels=labels, cell=tag)
                    raise
        finally:
            if not direct:
                _fetch_log(manager, node=node, remote=node_log, local=bench_log)
        watchdog.check()
        if not result.ok:
            _check_interrupted(result.returncode, node=node)
            raise ClientError(
                f"client exited {result.returncode} on node {node}"
                f"{_client_cause(bench_log) or _full_disk(manager, node, node_out)}",
                cell=tag,
                log=f"bench log {bench_log}",
            )
        written_at = record_written_at(manager, node=node, path=node_out)
        if not direct:
            manager.transport.get(node, node_out, local_out, private=True)
        if not local_out.exists() or local_out.stat().st_size == 0:
            raise ClientError("client wrote no record", cell=tag, log=f"bench log {bench_log}")
        record = read_record(local_out)
    finally:
        local_out.unlink(missing_ok=True)  # it holds the key (SGLang's server_info): read, gone
        if not direct:
            with contextlib.suppress(TransportError):  # never hides the cell's own error
                manager.transport.run(node, f"rm -f {shlex.quote(node_out)}", timeout=60)
    sent = workload.num_requests + workload.warmup_requests
    count = isolation.compare_requests(
        before=counters, after=isolation.request_counters(_entry_urls(state), key=key), sent=sent
    )
    # SGLang reports its api_key in /server_info, which the record carries: masked.
    fields = json.loads(scrub(json.dumps(record.model_dump()), key))
    access = {"api_key": key is not None, **count.to_dict()}
    process = client_usage(bench_log, cell=tag)
    return BenchRecord.model_validate(
        {
            **fields,
            ISOLATION_KEY: alone.to_dict(),
            REQUESTS_KEY: access,
            **({} if process is None else {usage.RECORD_KEY: process.to_dict()}),
            **({} if written_at is None else {CLOCK_KEY: {"record_written_at": written_at}}),
        }
    )


def record_written_at(manager: ServerManager, *, node: str, path: str) -> float | None:
    """When the client wrote its record (epoch seconds, the node's clock, where nvidia-smi
    stamps its samples too); None when the node does not say."""
    res = manager.transport.run(node, f"date -r {shlex.quote(path)} +%s.%N", timeout=60)
    try:
        return float(res.stdout.strip()) if res.ok else None
    except ValueError:
        return None


def private_file(path: Path) -> None:
    """Create `path` empty with mode 0600 (its folder as needed); it must not exist yet."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))


def _stop_left_client(
    manager: ServerManager, *, node: str, labels: dict[str, str], cell: str
) -> None:
    """After the client's command did not return (Ctrl-C, SIGTERM, a timeout, a dropped SSH
    session): stop the client it left, if any (an SSH client's container outlives its
    session; a local one, its shell), so no process of this cell goes on loading the server
    or outlives the job. Best effort: the cell's own error is what the job reports."""
    try:
        isolation.stop_clients(runtime=manager.runtime, node=node, labels=labels)
    except Exception as exc:  # noqa: BLE001 - never hides the cell's own error
        logger.warning("cell %s: could not stop its client on node %s: %s", cell, node, exc)


def client_usage(bench_log: Path, *, cell: str) -> usage.ProcessUsage | None:
    """The client process's figures the wrapper (loadgen.usage) printed into its bench log;
    None, with a warning, when the line is missing or garbled (no figure is invented)."""
    try:
        text = bench_log.read_text(errors="replace")
    except OSError as exc:
        text, why = "", f"({exc.strerror or exc})"
    else:
        why = "(missing or garbled)"
    found = usage.parse(text)
    if found is None:
        logger.warning(
            "cell %s: no client process figures in bench log %s %s", cell, bench_log, why
        )
    return found


def _entry_urls(state: ServerState) -> list[str]:
    """Rank 0 of each role (not the router): the servers that count requests."""
    return [r.url for r in state.ranks if r.url and r.role != ROUTER_ROLE] or [state.base_url]


def client_files(
    manager: ServerManager, *, bench_log: Path, tag: str, pid: int | str
) -> tuple[str, str]:
    """(record, log) paths the client writes on its node: straight into the run folder on this
    machine without docker (the record hidden, per job `pid`), else in the owner's node
    directory, copied back afterwards."""
    if manager.cluster.shares_run_folder:
        local_out = bench_log.with_name(f".{bench_log.stem}.{pid}.client.jsonl")
        return str(local_out.resolve()), str(bench_log.resolve())
    base = f"{manager.node_dir()}/client/{hashlib.sha256(tag.encode()).hexdigest()[:12]}"
    return f"{base}.jsonl", f"{base}.log"


def client_launch(
    *,
    exp: Experiment,
    manager: ServerManager,
    base_url: str,
    workload: Workload,
    tag: str,
    output_file: str,
    log_path: str,
    key: Secret | None = None,
) -> Launch:
    """The client of one cell (or warm-up) on the client node: the bench_serving or builtin
    command line under the usage wrapper (loadgen.usage), its log and labels (`servesweep
    commands` prints it too); `key`: the server's API key, given to the client in its
    environment (never in argv)."""
    digest = hashlib.sha256(tag.encode()).hexdigest()[:12]
    argv = loadgen.client_argv(
        kind=exp.client.kind,
        workload=workload,
        base_url=base_url,
        output_file=output_file,
        tag=tag,
        tokenizer=exp.client.tokenizer or exp.engine.model_path,
        python=exp.engine.python,
        sglang_version=exp.engine.version,
    )
    return Launch(
        name=f"servesweep-{manager.owner.tag}-{exp.run_id}-client-{digest}",
        node=exp.cluster.nodes[0],
        # under the outside wrapper: wall and CPU time of either client, alike (loadgen.usage)
        argv=usage.wrapped(argv, python=exp.engine.python),
        log_path=log_path,
        env=loadgen.client_env(exp.client.kind),
        labels=client_labels(exp=exp, manager=manager),
        accelerators=False,  # a client needs the network only: no GPU, device, privilege
        secret_env=None if key is None else (loadgen.API_KEY_ENV, key),
    )


def client_labels(*, exp: Experiment, manager: ServerManager) -> dict[str, str]:
    """Labels of this owner's clients of this run and pool (stale-client search finds only
    these: another pool's client is not stale)."""
    return {
        "run": exp.run_id,
        "role": "client",
        POOL_LABEL: str(manager.pool),
        **manager.owner.labels(),
    }


ISOLATION_KEY = "servesweep_isolation"


# The server's own request count over the client's run against the client's (issue 17 item 11).
REQUESTS_KEY = "servesweep_requests"

# When the client wrote its record: the end of its measured window. bench_serving 0.5.17 writes
# it right after its clock stops (two /server_info calls and the metrics in between) and exits
# about 1.8 s later (the H200 rehearsal), so the process's exit is no end for the window.
CLOCK_KEY = "servesweep_client_clock"


def remove_partial_client_files(bench_log: Path, *, events: EventLog, cell: str) -> list[Path]:
    """Remove the hidden client files a killed job of this cell left (`.<repeat>.<pid>.client
    .jsonl` of a pid no longer running, or the older `.<repeat>.client.jsonl`); report each."""
    found = sorted(bench_log.parent.glob(f".{bench_log.stem}.*client.jsonl"))
    return _remove_partials(found, events=events, cell=lambda _: cell)


def remove_run_partials(run_dir: Path, *, events: EventLog) -> list[Path]:
    """At the start of a run (Snakemake's onstart): remove every hidden client file a killed
    job left under bench/ (it holds the record with /server_info, which may carry the API
    key), also of a cell that never runs again; report each."""
    found = sorted(Path(run_dir, "bench").glob("*/*/.*client.jsonl"))
    return _remove_partials(
        found,
        events=events,
        cell=lambda p: f"{p.parent.parent.name}/{p.parent.name}/{p.name.split('.')[1]}",
    )


def _remove_partials(
    paths: list[Path], *, events: EventLog, cell: Callable[[Path], str]
) -> list[Path]:
    removed = []
    for path in paths:
        parts = path.name.split(".")  # "", "r1", pid, "client", "jsonl" (or without pid)
        pid = parts[2] if len(parts) == 5 else ""
        if pid.isdigit() and Path(f"/proc/{pid}").exists():
            continue  # a job still running (the server lock keeps it from measuring now)
        path.unlink(missing_ok=True)
        removed.append(path)
        events.emit("partial-removed", cell=cell(path), file=str(path))
        logger.warning(
            "cell %s: removed %s, a partial client file of a killed job", cell(path), path
        )
    return removed


def measured_alone(
    *, exp: Experiment, manager: ServerManager, state: ServerState, tag: str
) -> isolation.Isolation:
    """Before a client starts: remove stale clients of this run (any runtime), then wait until
    the server reports no running or queued request; both checks go into the record."""
    node = exp.cluster.nodes[0]
    removed = isolation.remove_stale_clients(
        runtime=manager.runtime,
        events=manager.events,
        node=node,
        labels=client_labels(exp=exp, manager=manager),
        cell=tag,
    )
    urls = [r.url for r in state.ranks if r.url]
    load = isolation.wait_idle(
        urls=urls or [state.base_url],
        server=state.server_id,
        node=node,
        cell=tag,
        key=manager.api_key(state),
    )
    alone = isolation.Isolation(
        stale_clients_removed=removed,
        running=load.running if load.known else None,
        queued=load.queued if load.known else None,
        load_sources=load.sources,
    )
    manager.events.emit(
        "alone",
        cell=tag,
        stale_clients=len(removed),
        running=alone.running,
        queued=alone.queued,
        source=",".join(load.sources) or "none",
    )
    return alone


# Signals that stop a client from outside (Ctrl-C, a batch system, `kill`, `docker stop`, the
# OOM killer), as its exit status gives them: 128 + N from a shell, -N from a direct child.
_STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL)


def _check_interrupted(returncode: int, *, node: str) -> None:
    """Raise the interruption a client's exit status says (KeyboardInterrupt for SIGINT,
    Terminated for the others of _STOPPING), so it is reported as what stopped the cell, not
    as a ClientError; a client's own failure (another code, a crash signal) raises nothing."""
    number = -returncode if returncode < 0 else returncode - 128
    sig = next((s for s in _STOPPING if s == number), None)
    if sig is None:
        return
    if sig == signal.SIGINT:
        raise KeyboardInterrupt(f"its client got SIGINT (exit {returncode}) on node {node}")
    how = " (`kill -9`, `docker rm -f` or the OOM killer)" if sig == signal.SIGKILL else ""
    raise Terminated(f"stopped by {sig.name}: its client got it{how}", sig)


def _client_cause(bench_log: Path) -> str:
    """A known cause in the client's log (a full disk where it writes its record), or ""."""
    try:
        text = bench_log.read_text(errors="replace")[-20000:]
    except OSError:
        return ""
    for line in reversed(text.splitlines()):
        if "No space left on device" in line or "[Errno 28]" in line:
            return f" (its disk is full: {line.strip()[-200:]})"
    return ""


def _full_disk(manager: ServerManager, node: str, path: str) -> str:
    """ " (its disk is full: DIR has 0 KiB free)" when the filesystem the client writes its
    record (and, beside it, its log) to has no space left: a full disk cannot hold the
    client's own error message either. "" otherwise, or when `df` cannot tell."""
    folder = shlex.quote(str(Path(path).parent))
    try:
        res = manager.transport.run(node, f"df -Pk {folder} | tail -n 1", timeout=60)
    except TransportError:
        return ""
    fields = res.stdout.split()
    if res.ok and len(fields) >= 4 and fields[3] == "0":
        return f" (its disk is full: {Path(path).parent} has 0 KiB free on node {node})"
    return ""


def _fetch_log(manager: ServerManager, *, node: str, remote: str, local: Path) -> None:
    """Copy the client's log back, best effort: a failed copy must not hide the real error."""
    try:
        manager.transport.get(node, remote, local)
    except TransportError as exc:
        logger.warning("could not copy the bench log back from node %s: %s", node, exc)
