"""Fault-injection harness: a fault shim outside the config, runs, and the shared checks."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from servesweep.core.events import read_events
from tests.helpers import REPO, experiment_file
from tests.integration.nodes import sim_in_docker, ssh_cluster

# The suite's matrix: MoE runner marlin | flashinfer_mxfp4 x concurrency 2 | 4, one repeat, tiny
# requests. A scenario runs one of two slices of it: ACROSS (marlin then flashinfer_mxfp4 at
# concurrency 2: a fault of the second server config, the first one finished) or WITHIN
# (flashinfer_mxfp4 at concurrency 2 and 4: a fault in the second cell of one server).
BACKENDS = ("marlin", "flashinfer_mxfp4")
CONCURRENCIES = (2, 4)
TARGET = "flashinfer_mxfp4"
ACROSS = {"backends": BACKENDS, "concurrencies": (2,)}
WITHIN = {"backends": (TARGET,), "concurrencies": CONCURRENCIES}
REQUESTS = 4  # per cell
# Arrival index (per server process) of a request in the second cell of a server config.
SECOND_CELL_INDEX = REQUESTS + 1
REQUEST_TIMEOUT_S = 4
READY_TIMEOUT_S = 10


def server_id(backend: str) -> str:
    return f"moe_runner_backend~{backend},chunked_prefill_size~8192"


def cell_keys(backends: Iterable[str], concurrencies: Iterable[int]) -> list[str]:
    """Cell keys in the order the workflow runs them (server configs in matrix order)."""
    return [f"{server_id(b)}/concurrency~{c}/r1" for b in backends for c in concurrencies]


STABLE_COLUMNS = [
    "server_id",
    "client_id",
    "repeat",
    "moe_runner_backend",
    "chunked_prefill_size",
    "concurrency",
    "completed",
    "total_input_tokens",
    "total_output_tokens",
]
SNAKEMAKE_TIMEOUT_S = 600
HANG_MARKER = "will never be answered"


def unique_run_id(name: str) -> str:
    """A run id no other test (or earlier session) uses: containers and labels never mix."""
    return f"rel-{name}-{uuid.uuid4().hex[:6]}"


# ---------------------------------------------------------------- the fault shim

SHIM = """#!/bin/sh
# servesweep reliability tests: `engine.python` of every run. Runs the real interpreter; a sim
# process whose argv contains the first field of a line of {control} gets the rest of that line
# as extra flags (`@fatal TEXT`: print TEXT to the log once the server is ready, keep running).
# The fault's cause lives here, outside the experiment config, so fingerprints never change.
real={real}
control={control}
case " $* " in
*" servesweep.sim "*) ;;
*) exec "$real" "$@" ;;
esac
extra=""
fatal=""
if [ -r "$control" ]; then
    while IFS='\t' read -r match flags; do
        [ -n "$match" ] || continue
        case " $* " in
        *"$match"*)
            case "$flags" in
            "@fatal "*) fatal="${{flags#@fatal }}" ;;
            *) extra="$extra $flags" ;;
            esac
            ;;
        esac
    done < "$control"
fi
if [ -n "$fatal" ]; then
    log=$(readlink /proc/$$/fd/1)
    (
        until grep -q 'fired up and ready' "$log" 2>/dev/null; do sleep 0.05; done
        echo "$fatal"
    ) &
fi
exec "$real" "$@" $extra
"""


@dataclass
class FaultShim:
    """A `python3` wrapper plus its control file: `inject` arms a fault, `clear` removes it."""

    directory: Path

    @classmethod
    def create(cls, directory: Path) -> FaultShim:
        directory.mkdir(parents=True, exist_ok=True)
        shim = cls(directory)
        text = SHIM.format(real=shlex.quote(sys.executable), control=shlex.quote(str(shim.control)))
        shim.python.write_text(text)
        shim.python.chmod(0o755)
        directory.chmod(0o755)
        return shim

    @property
    def python(self) -> Path:
        return self.directory / "python3"

    @property
    def control(self) -> Path:
        return self.directory / "faults"

    def inject(self, match: str, flags: str) -> None:
        """Sim processes whose argv contains `match` get `flags` (one rule per call); a lone
        surrogate in `flags` is written as the byte it escapes (`\\udcff`: 0xff, no UTF-8)."""
        with self.control.open("a", errors="surrogateescape") as fh:
            fh.write(f"{match}\t{flags}\n")
        self.control.chmod(0o644)

    def clear(self) -> None:
        """The cause is removed: every sim starts as configured."""
        self.control.unlink(missing_ok=True)

    def flag_file(self, name: str) -> Path:
        """A marker file in the shim directory (mounted into containers too)."""
        return self.directory / name


# ---------------------------------------------------------------- configs


def workload(request_timeout_s: float = REQUEST_TIMEOUT_S) -> dict[str, Any]:
    """The suite's tiny requests (`workload:`), each given up after `request_timeout_s`."""
    return {
        "input_len": 512,
        "output_len": 4,
        "num_requests": REQUESTS,
        "request_timeout_s": request_timeout_s,
    }


def local_config(
    run_id: str,
    shim: FaultShim,
    *,
    backends: Iterable[str] = BACKENDS,
    concurrencies: Iterable[int] = CONCURRENCIES,
    **extra: Any,
) -> dict[str, Any]:
    """A slice of the suite's matrix on this machine (process runtime, local transport)."""
    return {
        "run_id": run_id,
        "engine": {
            "python": str(shim.python),
            "ready_timeout_s": READY_TIMEOUT_S,
            "sim": {"time_scale": 0.001, "startup_s": 5},
        },
        "matrix": {
            "server": {"moe_runner_backend": list(backends), "chunked_prefill_size": [8192]},
            "client": {"concurrency": list(concurrencies)},
        },
        "workload": workload(),
        "repeats": 1,
        "baseline": {"moe_runner_backend": TARGET},
        **extra,
    }


# ---------------------------------------------------------------- runs


@dataclass
class Run:
    """One experiment in its own working directory, run with the real snakemake CLI."""

    workdir: Path
    config: Path
    run_id: str
    port: int
    cells: list[str]
    env: dict[str, str] = field(default_factory=dict)
    in_containers: bool = False  # docker runtime: its containers count as left running too

    @classmethod
    def create(cls, workdir: Path, changes: dict[str, Any], **env: str) -> Run:
        config = experiment_file(workdir, changes)
        raw = _yaml(config)
        cells = cell_keys(
            raw["matrix"]["server"]["moe_runner_backend"], raw["matrix"]["client"]["concurrency"]
        )
        port, in_containers = int(raw["engine"]["port"]), raw["runtime"]["kind"] == "docker"
        return cls(workdir, config, raw["run_id"], port, cells, dict(env), in_containers)

    @property
    def run_dir(self) -> Path:
        return self.workdir / "results" / self.run_id

    @property
    def targets(self) -> list[str]:
        """Every cell's raw file and results.csv: `rule all` without the plots."""
        raws = [str(self.raw(c).relative_to(self.workdir)) for c in self.cells]
        return [*raws, f"results/{self.run_id}/results.csv"]

    def argv(self, *args: str) -> list[str]:
        exe = shutil.which("snakemake")
        assert exe, "snakemake is not installed"
        return [exe, "-s", str(REPO / "Snakefile"), "-d", str(self.workdir), *args]

    def full_env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        env = {**os.environ, **self.env, **(extra or {})}
        for var in ("RUN_ID", "BACKENDS_CSV", "CHUNKED_PREFILL_SIZES_CSV", "CONCURRENCIES_CSV"):
            if var not in self.env and var not in (extra or {}):
                env.pop(var, None)
        env.pop("EP_SIZE", None)
        return env

    def snakemake(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """`snakemake --cores 1 <targets>` (or `args`) to completion."""
        args = args or ("--cores", "1", *self.targets)
        return subprocess.run(
            self.argv(*args, "--configfile", str(self.config)),
            capture_output=True,
            text=True,
            env=self.full_env(env),
            timeout=SNAKEMAKE_TIMEOUT_S,
        )

    def start(
        self, env: dict[str, str] | None = None, *, sigint_ignored: bool = False
    ) -> subprocess.Popen[str]:
        """The same run in the background, in its own process group (for signals).

        SIGINT gets its default action back: started from a shell without job control (`cmd &`)
        the tests inherit it ignored, and so would snakemake and its jobs. `sigint_ignored`:
        started as such a shell starts it, SIGINT ignored."""
        return subprocess.Popen(
            self.argv("--cores", "1", *self.targets, "--configfile", str(self.config)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.full_env(env),
            start_new_session=True,
            preexec_fn=_ignore_sigint if sigint_ignored else _default_sigint,
        )

    def events(self) -> list[tuple[str, str, dict[str, str]]]:
        return read_events(self.run_dir / "orchestrator.log")

    def started(self, since: int = 0) -> list[str]:
        """Cells in the order their `cell-start` was logged, from event number `since` on."""
        return [f["cell"] for _, e, f in self.events()[since:] if e == "cell-start"]

    def raw(self, cell: str) -> Path:
        return self.run_dir / "raw" / f"{cell}.jsonl"

    def gpu(self, cell: str) -> Path:
        return self.run_dir / "gpu" / f"{cell}.csv"

    def server_log(self, backend: str, node: str = "local") -> Path:
        return self.run_dir / "service" / server_id(backend) / f"{node}.log"

    def leftovers(self) -> list[str]:
        """What of the run still runs: its containers (docker), processes on its port."""
        ids = containers(self.run_id) if self.in_containers else []
        return [f"container {c[:12]}" for c in ids] + local_leftovers(self.port)

    def finished(self) -> dict[str, str]:
        """cell -> digest of its raw and gpu files (content and mtime), for cells with both."""
        out = {}
        for cell in self.cells:
            raw, gpu = self.raw(cell), self.gpu(cell)
            if raw.exists() and gpu.exists():
                h = hashlib.sha256(raw.read_bytes() + gpu.read_bytes())
                h.update(f"{raw.stat().st_mtime_ns} {gpu.stat().st_mtime_ns}".encode())
                out[cell] = h.hexdigest()
        return out


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _yaml(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def output(proc: subprocess.CompletedProcess[str]) -> str:
    """Everything a finished snakemake printed."""
    return (proc.stdout or "") + (proc.stderr or "")


def error_lines(text: str) -> list[str]:
    """The one-line errors servesweep printed (`servesweep: <Kind>: ...`), each from its marker
    on. A signal to the whole process group (SIGHUP, SIGTERM) makes Snakemake and the job write
    to the shared stderr at once, so the job's line can start after Snakemake's text on the
    same line ("...currently running jobs (scheduler).servesweep: Terminated: ...")."""
    found = (re.search(r"servesweep: [A-Za-z]+: .*", line) for line in text.splitlines())
    return [m.group(0) for m in found if m]


def wait_for(predicate: Callable[[], bool], limit_s: float = 60.0, what: str = "") -> None:
    """Poll until `predicate` holds (a bound against hanging, not a timing assertion)."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"gave up waiting for {what or predicate}")


def file_contains(path: Path, needle: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return needle in path.read_text(errors="replace")
        except FileNotFoundError:
            return False

    return check


def kill_group(proc: subprocess.Popen[str], sig: signal.Signals) -> None:
    """Signal a background snakemake's whole process group (as Ctrl-C or `kill -9 -pgid`)."""
    os.killpg(proc.pid, sig)


def local_leftovers(port: int) -> list[str]:
    """Processes of this machine still serving or calling the test's unique engine port."""
    pattern = re.compile(rf"(--port\x00{port}\x00|:{port}\b)")
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if pattern.search(cmdline) and int(proc.name) != os.getpid():
            found.append(f"{proc.name}: {cmdline.replace(chr(0), ' ')[:200]}")
    return found


def kill_local_leftovers(port: int) -> None:
    """Teardown safety net: end what this test started and left (by pid)."""
    for entry in local_leftovers(port):
        pid = int(entry.split(":")[0])
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------- checks


class KnownGap(AssertionError):
    """A requirement the product does not meet yet (tests expecting it are strict xfails)."""


class Checks:
    """Records each check in the JUnit XML (for docs/reliability.md), then asserts it."""

    def __init__(self, record: Callable[[str, object], None]) -> None:
        self.record = record
        self.gaps: list[str] = []

    def scenario(self, name: str) -> None:
        self.record("scenario", name)

    def check(self, what: str, ok: bool, detail: str = "") -> None:
        self.record("check", what)
        assert ok, f"{what}: {detail}" if detail else what

    def gap(self, what: str, ok: bool, detail: str = "") -> None:
        """A check of a known gap: remembered, raised as KnownGap by `finish` (such tests are
        xfail(raises=KnownGap, strict=True), so a fixed gap turns them red)."""
        self.record("check", f"{what} [known gap]")
        if not ok:
            self.gaps.append(f"{what}: {detail}" if detail else what)

    def finish(self) -> None:
        """Raise KnownGap if a gap check failed (call last in a test with gap checks)."""
        if self.gaps:
            raise KnownGap("; ".join(self.gaps))

    def message(self, line: str) -> None:
        self.record("message", line)

    def note(self, text: str) -> None:
        self.record("note", text)


def failed_cells(run: Run) -> list[str]:
    """Cells that started and never finished, in the order they started."""
    done = {f["cell"] for _, e, f in run.events() if e == "cell-done"}
    return [c for c in dict.fromkeys(run.started()) if c not in done]


def log_paths(line: str) -> list[str]:
    """Paths of log files named in an error line (`x.log`, or a kept `x.log.failed-...`)."""
    tokens = (t.strip(",;:'\"()") for t in line.split())
    return [t for t in tokens if re.search(r"\.log($|\.)", t)]


def check_stopped_cleanly(
    checks: Checks,
    run: Run,
    proc: subprocess.CompletedProcess[str],
    *,
    cause: str,
    node: str = r"node local\b",
    finished: int,
    name_cell: bool = True,
) -> str:
    """The common checks of a failed run (`proc`: its snakemake); returns the error line shown."""
    returncode, text = proc.returncode, output(proc)
    checks.check("the run exits non-zero", returncode != 0, f"exit {returncode}")
    lines = error_lines(text)
    checks.check("a one-line `servesweep: <Kind>: ...` error is printed", bool(lines), text[-3000:])
    line = lines[0]
    checks.message(line)
    checks.check(
        f"the error names the cause ({cause})",
        re.search(cause, line) is not None,
        line,
    )
    failed = failed_cells(run)
    # A start that fails in a server config's equivalence probe (its first job) fails no cell:
    # the probe's server is what started and did not finish.
    probes = [f.get("server", "") for _, e, f in run.events() if e == "probe-failed"]
    if name_cell:
        checks.check(
            "a cell started and did not finish (or its server config's equivalence probe)",
            bool(failed or probes),
            str(run.events()),
        )
        named = failed[0] if failed else probes[0]
        checks.check("the error names the failed cell (or its server config)", named in line, line)
    checks.check(f"the error names the node ({node})", re.search(node, line) is not None, line)
    logs = log_paths(line)
    existing = [p for p in logs if (run.workdir / p).exists() or Path(p).exists()]
    checks.check("the error names a log file that exists", bool(existing), f"{logs} in {line}")
    left = run.leftovers()
    checks.check("no server, client or container is left", not left, "\n".join(left))
    for cell in failed:
        stray = [
            p
            for d in (run.raw(cell).parent, run.gpu(cell).parent)
            if d.exists()
            for p in d.iterdir()
            if p.name.startswith(f"r{cell.rsplit('/r', 1)[1]}.") or p.name.startswith(".")
        ]
        checks.check(
            f"no finished-looking or partial file for the failed cell {cell}",
            not stray,
            str(stray),
        )
    done = [f["cell"] for _, e, f in run.events() if e == "cell-done"]
    kept = run.finished()
    checks.check(
        f"finished cells are kept ({finished} of {len(run.cells)})",
        set(done) == set(kept) and len(kept) == finished,
        f"done {done}, files {sorted(kept)}",
    )
    return line


def check_later_run_reuses_the_service(checks: Checks, run: Run, later: str) -> None:
    """A run under RUN_ID `later` in `run`'s folder, while `run`'s `servesweep up` service is
    up: it succeeds, reuses the service (no start), and its cells sent the service's key with
    the server counting exactly their requests."""
    proc = run.snakemake("--cores", "1", f"results/{later}/results.csv", env={"RUN_ID": later})
    checks.check("the later run succeeds", proc.returncode == 0, output(proc)[-3000:])
    events = read_events(run.workdir / "results" / later / "orchestrator.log")
    checks.check(
        "it reuses the service (no start)",
        any(e == "reuse" and f.get("service") for _, e, f in events)
        and not any(e == "start" for _, e, _ in events),
        str(events),
    )
    raws = list((run.workdir / "results" / later / "raw").rglob("*.jsonl"))
    counts = [json.loads(p.read_text()).get("servesweep_requests") or {} for p in raws]
    checks.check(
        "its cell sent the service's key and the server counted exactly its requests",
        bool(counts) and all(c.get("api_key") and c.get("difference") == 0 for c in counts),
        str(counts),
    )


def stable(results: pd.DataFrame) -> pd.DataFrame:
    """The columns of results.csv a fault may not change, rows in a fixed order."""
    keys = ["server_id", "client_id"]
    return results[STABLE_COLUMNS].sort_values(keys).reset_index(drop=True)


def check_rerun(
    checks: Checks,
    run: Run,
    before: dict[str, str],
    events_before: int,
    proc: subprocess.CompletedProcess[str],
    reference: pd.DataFrame,
    *,
    reruns_finished: bool = False,
) -> None:
    """After the cause is removed: only missing cells run, and the results equal a clean run.

    `reruns_finished`: a known gap makes the rerun redo finished cells (checked as a gap)."""
    only_missing = checks.gap if reruns_finished else checks.check
    checks.check("the rerun succeeds", proc.returncode == 0, output(proc)[-4000:])
    events = run.events()[events_before:]
    rerun_cells = run.started(events_before)
    missing = [c for c in run.cells if c not in before]
    only_missing(
        f"the rerun runs only the {len(missing)} missing cell(s)",
        sorted(rerun_cells) == sorted(missing),
        f"ran {rerun_cells}, missing {missing}",
    )
    starts = [f["server"] for _, e, f in events if e == "start"]
    needed = {c.split("/")[0] for c in missing}
    only_missing(
        "the rerun starts at most one server per config with missing cells",
        set(starts) <= needed and len(starts) == len(set(starts)),
        f"starts {starts}, needed {needed}",
    )
    after = run.finished()
    only_missing(
        "cells finished before the failure are untouched (content and mtime)",
        all(after.get(c) == d for c, d in before.items()),
        f"changed: {[c for c, d in before.items() if after.get(c) != d]}",
    )
    df = pd.read_csv(run.run_dir / "results.csv")
    got = stable(df)
    cells = {tuple(c.split("/")[:2]) for c in run.cells}
    keys = reference[["server_id", "client_id"]].itertuples(index=False)
    want = stable(reference[[tuple(k) in cells for k in keys]])
    checks.check(
        "results.csv equals an uninterrupted run's (cells, counts, token totals)",
        len(want) == len(run.cells) and got.equals(want),
        f"\n{got}\nvs\n{want}",
    )
    fps = df.groupby("server_id")["fingerprint"].nunique()
    checks.check(
        "one fingerprint per server config across the failed run and the rerun",
        bool((fps == 1).all()),
        str(fps),
    )
    left = run.leftovers()
    checks.check("nothing is left running after the rerun", not left, "\n".join(left))


def rerun_and_check(
    checks: Checks,
    run: Run,
    reference: pd.DataFrame,
    *,
    remove_cause: Callable[[], object] | None = None,
) -> None:
    """Note the finished cells, remove the fault's cause, rerun, and make the rerun checks."""
    before, n_events = run.finished(), len(run.events())
    if remove_cause:
        remove_cause()
    check_rerun(checks, run, before, n_events, run.snakemake(), reference)


# ---------------------------------------------------------------- disk


@contextlib.contextmanager
def small_filesystem(path: Path, *, size: str = "64k") -> Iterator[Path]:
    """A tmpfs of `size` mounted at `path` (created), unmounted afterwards whatever happened."""
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {res.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def fill(directory: Path, name: str = "filler.bin") -> Path:
    """Write zeros into `directory` until its filesystem is full; return the filler file."""
    filler = directory / name
    chunk = b"\0" * 4096
    with filler.open("wb", buffering=0) as fh:
        while True:
            try:
                fh.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
    return filler


# ---------------------------------------------------------------- cluster (sshd + dockerd)

CLUSTER_READY_TIMEOUT_S = 60


def cluster_config(
    run_id: str,
    shim: FaultShim,
    *,
    nodes_dir: Path,
    nodes: list[str],
    backends: Iterable[str],
    concurrencies: Iterable[int],
    smoke: list[str] | None = None,
    request_timeout_s: float = REQUEST_TIMEOUT_S,
) -> dict[str, Any]:
    """A slice of the suite's matrix on the loopback SSH nodes, one container per rank, running
    this checkout's code (`REPO`)."""
    config = local_config(run_id, shim, backends=backends, concurrencies=concurrencies)
    config["engine"]["ready_timeout_s"] = CLUSTER_READY_TIMEOUT_S
    config["workload"] = workload(request_timeout_s)
    cluster = ssh_cluster(nodes_dir, nodes, gpus_per_node=8)
    cluster["ssh"]["connect_timeout_s"] = 10
    return {
        **config,
        "cluster": cluster,
        "runtime": sim_in_docker(
            REPO, mounts=[f"{shim.directory}:{shim.directory}:ro"], sudo=False, smoke=smoke or []
        ),
        "server": {"tp_size": 8 * len(nodes), "ep_size": 8 * len(nodes)},
    }


def docker(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The docker CLI of this machine (the test nodes share its dockerd)."""
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)


def containers(run_id: str, **labels: str) -> list[str]:
    """Ids of containers (running or not) carrying the run's label and `labels`."""
    filters = [f"label=servesweep.run={run_id}"] + [
        f"label=servesweep.{k}={v}" for k, v in labels.items()
    ]
    args = ["ps", "-aq", "--no-trunc"]
    for f in filters:
        args += ["--filter", f]
    return docker(*args).stdout.split()


def remove_containers(run_id: str) -> None:
    """Teardown safety net: remove the run's containers (this test started them)."""
    ids = containers(run_id)
    if ids:
        docker("rm", "-f", *ids)


def container_log_contains(container: Callable[[], list[str]], needle: str) -> Callable[[], bool]:
    def check() -> bool:
        ids = container()
        if not ids:
            return False
        res = docker("logs", ids[0])
        return needle in res.stdout + res.stderr

    return check


def descendants(root: int) -> set[int]:
    """`root` and every process below it."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.add(pid)
            todo += children.get(pid, [])
    return out


def ssh_sessions(root: int, address: str, *, listener: int) -> list[int]:
    """Pids of the sshd processes serving TCP connections that processes under `root` opened to
    `address`:22 (never the listening sshd)."""
    mine = descendants(root)
    res = subprocess.run(["ss", "-tnpH", "state", "established"], capture_output=True, text=True)
    ours: set[str] = set()
    serving: dict[str, set[int]] = {}
    for line in res.stdout.splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        local, peer = parts[2], parts[3]
        pids = {int(p) for p in re.findall(r"pid=(\d+)", line)}
        if peer == f"{address}:22" and pids & mine:
            ours.add(local)
        if local == f"{address}:22":
            serving.setdefault(peer, set()).update(pids)
    return sorted({p for end in ours for p in serving.get(end, set())} - {listener})


# ---------------------------------------------------------------- faults during a hung request


def hang_started(run: Run) -> Callable[[], bool]:
    """Whether the second cell's request hangs: rank 0's server log says so."""
    if not run.in_containers:
        return file_contains(run.server_log(TARGET), HANG_MARKER)
    return container_log_contains(
        lambda: containers(run.run_id, role="server", rank="0"), HANG_MARKER
    )


def run_during_hang(
    run: Run,
    shim: FaultShim,
    act: Callable[[subprocess.Popen[str]], None],
    *,
    sigint_ignored: bool = False,
) -> subprocess.CompletedProcess[str]:
    """Start the run with the second cell's request hanging (a window of the request timeout);
    once it hangs, call `act` on snakemake (a signal, a kill), wait for it, clear the fault.
    `sigint_ignored`: snakemake starts with SIGINT ignored (Run.start)."""
    shim.inject(TARGET, f"--sim-hang-at {SECOND_CELL_INDEX}")
    proc = run.start(sigint_ignored=sigint_ignored)
    try:
        wait_for(
            hang_started(run),
            limit_s=300 if run.in_containers else 60,
            what=f"request #{SECOND_CELL_INDEX} to hang",
        )
        act(proc)
        out, err = proc.communicate(timeout=SNAKEMAKE_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            kill_group(proc, signal.SIGKILL)
            proc.communicate()
    shim.clear()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def check_killed_during_hang(
    checks: Checks,
    run: Run,
    shim: FaultShim,
    reference: pd.DataFrame,
    *,
    kill: Callable[[subprocess.Popen[str]], None],
    cause: str,
    node: str,
) -> str:
    """Kill a part of the run while a request hangs: the stop checks, then the rerun checks;
    returns the error line shown."""
    proc = run_during_hang(run, shim, kill)
    line = check_stopped_cleanly(checks, run, proc, cause=cause, node=node, finished=1)
    rerun_and_check(checks, run, reference)
    return line


def check_rank1_dies(
    checks: Checks,
    run: Run,
    shim: FaultShim,
    reference: pd.DataFrame,
    *,
    kill_rank1: Callable[[subprocess.Popen[str]], None],
    node: str,
    died: str,
) -> None:
    """Rank 1 of a two-node server dies while a request hangs: the stop checks (the error names
    a node matching `node`), the rerun checks, and the error names the node that died."""
    line = check_killed_during_hang(
        checks,
        run,
        shim,
        reference,
        kill=kill_rank1,
        cause=r"ServerDied: .*(exited|nccl|fatal pattern)",
        node=node,
    )
    checks.check(f"the error names the node that died ({died})", f"node {died}" in line, line)
    checks.finish()


def sigkill_mid_cell(checks: Checks, run: Run, shim: FaultShim) -> None:
    """SIGKILL snakemake's process group while the second cell's request hangs."""
    proc = run_during_hang(run, shim, lambda p: kill_group(p, signal.SIGKILL))
    checks.check(
        "snakemake died of SIGKILL", proc.returncode == -signal.SIGKILL, str(proc.returncode)
    )


def check_rerun_after_sigkill(checks: Checks, run: Run, reference: pd.DataFrame) -> None:
    """The finished cell is kept; the rerun (unlocked if need be) finds the stale server and
    passes the rerun checks."""
    before, n_events = run.finished(), len(run.events())
    checks.check("the finished cell is kept", len(before) == 1, str(before))
    rerun = rerun_unlocked(checks, run)
    events = run.events()[n_events:]
    handled = [e for _, e, _ in events if e in ("reuse", "stale", "unhealthy")]
    checks.check(
        "the rerun found the stale server (reused if healthy, else removed by label)",
        bool(handled),
        str(events),
    )
    check_rerun(checks, run, before, n_events, rerun, reference)


def rerun_unlocked(checks: Checks, run: Run) -> subprocess.CompletedProcess[str]:
    """Rerun after snakemake was SIGKILLed: if Snakemake kept its lock, the plain rerun must
    refuse without touching anything, then `--unlock` and rerun (README: hard kill)."""
    n_events = len(run.events())
    first = run.snakemake()
    if first.returncode == 0:
        checks.note("no lock was left: the plain rerun went ahead")
        return first
    text = output(first)
    checks.check(
        "a plain rerun refuses with Snakemake's lock message",
        "LockException" in text or "locked" in text.lower(),
        text[-2000:],
    )
    lock_lines = [ln for ln in text.splitlines() if "lock" in ln.lower()]
    checks.message(next((ln for ln in lock_lines if "cannot be locked" in ln), lock_lines[0]))
    checks.check(
        "the refused rerun started nothing",
        len(run.events()) == n_events,
        str(run.events()[n_events:]),
    )
    unlock = run.snakemake("--unlock")
    checks.check("`snakemake --unlock` succeeds", unlock.returncode == 0, output(unlock))
    return run.snakemake()
