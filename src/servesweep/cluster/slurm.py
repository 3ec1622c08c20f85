"""Slurm as a cluster: one allocation per node pool, every server rank a long-lived job step of
it, every other node command a short `srun --overlap` step (docs/slurm.md).

- An allocation (`salloc --no-shell`) is found again by its name, `servesweep-<owner tag>-<run>-
  <pool's nodes>`: made lazily by the first command on one of its nodes (under a lock on the
  head), released by `release_allocations` (onsuccess/onerror, `servesweep down`).
- A server rank is `srun --jobid=A --overlap -N1 -n1 -w NODE -J <launch name> ...`, started on
  the head in its own session (a Ctrl-C to the run's process group never reaches it) and held
  there: its handle is `A.S:<pid of that srun>`. A rank whose head-side srun is gone counts as
  dead (its step is cancelled when it is stopped).
- Under proctrack/cgroup a process a short step leaves behind dies with the step: a server is
  never started from a short step (`ProcessRuntime` through this transport fails; tested).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import select
import shlex
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from servesweep.cluster.owner import SERVICE_LABEL, current_owner
from servesweep.cluster.runtime import (
    COMMAND_TIMEOUT_S,
    ENV_LABEL_PREFIX,
    CommandResult,
    Labelled,
    Launch,
    _has_all,
    cache_dir_prep,
    env_assigns,
    env_value,
    label_env,
    launch_cache_prep,
    node_dir_prep,
    private_root,
    read_secret_line,
    secret_stdin,
)
from servesweep.cluster.secrets import Secret
from servesweep.config.experiment import Experiment, node_pools
from servesweep.config.schema import RuntimeConfig, SlurmOptions
from servesweep.core.errors import ConfigError, ServerStartError, TransportError
from servesweep.core.files import open_private, private_dir
from servesweep.core.names import safe_segment

logger = logging.getLogger(__name__)

ALLOC_PREFIX = "servesweep-"
STEP_WAIT_S = 60.0  # a started rank's step must show in squeue within this
STOP_GRACE_S = 30.0
QUERY_TIMEOUT_S = 60.0
_HANDLE = re.compile(r"(?P<job>[0-9]+)\.(?P<step>[0-9]+)(:(?P<pid>[0-9]+))?")
LOCK_DIR: str | None = None  # where the head's private folder is made; None: $TMPDIR or /tmp
SERVICE_MARK = "-service"  # the end of a service's step name (`servesweep up`)


@dataclass(frozen=True)
class Allocation:
    """One pool's Slurm allocation: its name, nodes and (once granted) job id and state."""

    name: str
    nodes: tuple[str, ...]
    job_id: str = ""
    state: str = ""


def step_name(launch: Launch) -> str:
    """A rank's step name: its launch name, SERVICE_MARK appended for a service of `servesweep
    up` (a run under another RUN_ID finds the service's allocation by it)."""
    return f"{launch.name}{SERVICE_MARK}" if SERVICE_LABEL in launch.labels else launch.name


def allocation_name(*, owner_tag: str, run_id: str, nodes: Iterable[str]) -> str:
    """`servesweep-<owner tag>-<run>-<node>+<node>...`: owner, run and pool."""
    pool = "+".join(safe_segment(n, what="node") for n in nodes)
    return f"{ALLOC_PREFIX}{owner_tag}-{run_id}-{pool}"


def _run(argv: list[str], *, timeout: float, stdin: str | None = None) -> CommandResult:
    """A Slurm client command on the head (never through a shell)."""
    try:
        proc = subprocess.run(
            argv,
            input=stdin if stdin is not None else "",
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
        )
    except FileNotFoundError:
        raise TransportError(f"{argv[0]} not found on this machine: is Slurm installed?") from None
    except subprocess.TimeoutExpired:
        raise TransportError(f"{shlex.join(argv)[:160]} timed out after {timeout:.0f}s") from None
    return CommandResult("head", shlex.join(argv), proc.returncode, proc.stdout, proc.stderr)


def squeue_jobs(name_prefix: str = ALLOC_PREFIX) -> list[Allocation]:
    """This user's jobs whose name starts with `name_prefix` (squeue: no slurmdbd needed)."""
    res = _run(["squeue", "-h", "-u", _user(), "-o", "%i|%j|%T|%N"], timeout=QUERY_TIMEOUT_S).check(
        "squeue"
    )
    out = []
    for line in res.stdout.splitlines():
        fields = line.strip().split("|")
        if len(fields) == 4 and fields[1].startswith(name_prefix):
            nodes = tuple(expand_hostlist(fields[3])) if fields[3] else ()
            out.append(Allocation(fields[1], nodes, fields[0], fields[2]))
    return out


def squeue_steps(job_id: str) -> dict[str, str]:
    """The steps of allocation `job_id`: step id (`A.S`) -> step name."""
    res = _run(["squeue", "-h", "-s", "-j", job_id, "-o", "%i|%j"], timeout=QUERY_TIMEOUT_S)
    if not res.ok:  # the allocation is gone
        return {}
    steps = {}
    for line in res.stdout.splitlines():
        step, _, name = line.strip().partition("|")
        if _HANDLE.fullmatch(step):
            steps[step] = name
    return steps


def expand_hostlist(hostlist: str) -> list[str]:
    """`node[1-2],gpu7` -> [node1, node2, gpu7] (scontrol show hostnames)."""
    if not re.search(r"[\[,]", hostlist):
        return [hostlist]
    res = _run(["scontrol", "show", "hostnames", hostlist], timeout=QUERY_TIMEOUT_S)
    return res.stdout.split() if res.ok else [hostlist]


def _user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def head_dir() -> Path:
    """This user's folder on the head (srun logs, locks): `private_head` checks it is ours."""
    return Path(LOCK_DIR or tempfile.gettempdir()) / f"servesweep-slurm-{os.getuid()}"


def private_head() -> Path:
    """head_dir, made or found private (core.files.private_dir): a folder another user
    planted there (0777, links or locks inside) is refused in one line naming it."""
    try:
        return private_dir(head_dir())
    except OSError as exc:
        raise TransportError(f"the head's Slurm folder {exc}") from None


@contextlib.contextmanager
def _head_lock(name: str) -> Iterator[None]:
    """An exclusive lock on the head (one per user), e.g. around making an allocation."""
    path = private_head() / f"{name}.lock"
    with open_private(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def salloc_argv(
    *, name: str, nodes: Iterable[str], options: SlurmOptions, gpus_per_node: int
) -> list[str]:
    """The `salloc --no-shell` line that makes one pool's allocation (`--immediate`: a request
    still pending after pending_timeout_s is withdrawn)."""
    nodes = list(nodes)
    argv = ["salloc", "--no-shell", f"--job-name={name}", f"--nodes={len(nodes)}"]
    argv.append(f"--nodelist={','.join(nodes)}")
    if options.partition:
        argv.append(f"--partition={options.partition}")
    if options.account:
        argv.append(f"--account={options.account}")
    argv.append(f"--time={options.time_limit}")
    if options.exclusive:
        argv.append("--exclusive")
    gpus = gpus_per_node if options.gpus_per_node is None else options.gpus_per_node
    if gpus:
        argv.append(f"--gres=gpu:{gpus}")
    argv.append(f"--immediate={options.pending_timeout_s}")
    return [*argv, *options.sbatch_flags]


def step_argv(
    job: str, node: str, *, name: str | None = None, extra: Iterable[str] = ()
) -> list[str]:
    """`srun --jobid=A --overlap -N1 -n1 -w NODE [-J NAME] ...`: one task on one node of the
    allocation, sharing its resources with the other steps."""
    argv = ["srun", f"--jobid={job}", "--overlap", "-N1", "-n1", "-w", node, "--quiet"]
    if name:
        argv.append(f"--job-name={name}")
    return [*argv, *extra]


class SlurmTransport:
    """Commands on a node as short `srun --overlap` steps of its pool's allocation; files
    through a step's stdin/stdout. The allocation is made on first use."""

    def __init__(self, exp: Experiment, *, results_root: str | Path = "results") -> None:
        self.exp = exp
        self.options = exp.cluster.slurm
        self.owner = current_owner(results_root)
        self.pools = [tuple(p.nodes) for p in node_pools(exp)]
        self._jobs: dict[str, str] = {}  # allocation name -> job id (granted)
        self._held: list[subprocess.Popen[str]] = []  # run_background's head-side sruns

    # ---------------------------------------------------------- allocations
    def pool_of(self, node: str) -> tuple[str, ...]:
        for nodes in self.pools:
            if node in nodes:
                return nodes
        if node in self.exp.cluster.nodes:
            return (node,)
        raise TransportError(f"node {node} is in no pool of cluster.nodes {self.exp.cluster.nodes}")

    def name_of(self, nodes: Iterable[str]) -> str:
        return allocation_name(owner_tag=self.owner.tag, run_id=self.exp.run_id, nodes=nodes)

    def allocation_names(self) -> list[str]:
        return [self.name_of(nodes) for nodes in self.pools]

    def find(self, node: str) -> str | None:
        """The job id of the running allocation holding `node` (None: there is none): the
        run's own, else one of this owner's that holds a service on `node` (a run reusing a
        service of `servesweep up` under another RUN_ID works in the service's allocation:
        one of its own could not be granted beside it)."""
        name = self.name_of(self.pool_of(node))
        if name in self._jobs:
            return self._jobs[name]
        for alloc in squeue_jobs(name):
            if alloc.name == name and alloc.state == "RUNNING":
                self._jobs[name] = alloc.job_id
                return alloc.job_id
        for alloc in squeue_jobs(f"{ALLOC_PREFIX}{self.owner.tag}-"):
            if alloc.state != "RUNNING" or node not in alloc.nodes:
                continue
            if any(n.endswith(SERVICE_MARK) for n in squeue_steps(alloc.job_id).values()):
                logger.info("slurm: node %s: in allocation %s, a service's", node, alloc.name)
                self._jobs[name] = alloc.job_id
                return alloc.job_id
        return None

    def allocate(self, node: str) -> str:
        """The job id of `node`'s pool allocation, made now if there is none (one line
        naming the allocation if Slurm does not grant it within pending_timeout_s)."""
        job = self.find(node)
        if job is not None:
            return job
        nodes = self.pool_of(node)
        name = self.name_of(nodes)
        with _head_lock(name):
            self._jobs.pop(name, None)
            job = self.find(node)
            if job is not None:
                return job
            argv = salloc_argv(
                name=name,
                nodes=nodes,
                options=self.options,
                gpus_per_node=self.exp.cluster.gpus_per_node,
            )
            logger.info("slurm: %s", shlex.join(argv))
            res = _run(argv, timeout=self.options.pending_timeout_s + QUERY_TIMEOUT_S)
            job = self.find(node)
            if not res.ok or job is None:
                # Nothing of it may stay queued: a withdrawn request is cancelled by name.
                _run(["scancel", "-u", _user(), "-n", name], timeout=QUERY_TIMEOUT_S)
                tail = (res.stderr or res.stdout).strip().splitlines()
                raise TransportError(
                    f"Slurm allocation {name} (nodes {','.join(nodes)}) not granted within "
                    f"{self.options.pending_timeout_s}s: {tail[-1] if tail else 'no reason given'}"
                )
        logger.info("slurm: allocation %s is job %s", name, job)
        return job

    # ---------------------------------------------------------- Transport
    def run(
        self, node: str, command: str, *, timeout: float, stdin: str | None = None
    ) -> CommandResult:
        job = self.allocate(node)
        argv = [*step_argv(job, node), "/bin/sh", "-c", command]
        try:
            proc = subprocess.run(
                argv,
                input=stdin or "",
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise TransportError(
                f"command timed out after {timeout:.0f}s on node {node} (job {job}): "
                f"{command[:120]}"
            ) from None
        return CommandResult(node, command, proc.returncode, proc.stdout, proc.stderr)

    def run_background(self, node: str, command: str, *, timeout: float) -> CommandResult:
        """`command` in a step of its own that ends with the process it starts (`; wait`),
        its head-side srun in a session of its own: under proctrack/cgroup a short step's
        background processes die with the step. Returns once the pid line is printed (or the
        step ended without one); close() ends the steps still held."""
        job = self.allocate(node)
        argv = [*step_argv(job, node), "/bin/sh", "-c", f"{command}; wait"]
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,  # a Ctrl-C to the run's group never reaches it
        )
        assert proc.stdout is not None
        printed: list[str] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not select.select([proc.stdout], [], [], 0.1)[0]:
                continue
            line = proc.stdout.readline()
            if not line:  # the step ended before a pid: the command's own failure
                proc.wait()
                return CommandResult(node, command, proc.returncode, "".join(printed), "")
            printed.append(line)
            if line.strip().isdigit():
                self._held.append(proc)
                return CommandResult(node, command, 0, "".join(printed), "")
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        raise TransportError(
            f"command timed out after {timeout:.0f}s on node {node} (job {job}): {command[:120]}"
        )

    def run_existing(self, node: str, command: str, *, timeout: float) -> CommandResult | None:
        """`run` in an allocation that already exists (None: there is none; none is made)."""
        if self.find(node) is None:
            return None
        return self.run(node, command, timeout=timeout)

    def put(self, node: str, local: Path, remote: str) -> None:
        cmd = f"{node_dir_prep(remote)} && cat > {shlex.quote(remote)}"
        self.run(node, cmd, timeout=QUERY_TIMEOUT_S, stdin=Path(local).read_text()).check(
            f"copy to {remote}"
        )

    def get(self, node: str, remote: str, local: Path, *, private: bool = False) -> None:
        from servesweep.core.files import atomic_open

        res = self.run(node, f"cat {shlex.quote(remote)}", timeout=QUERY_TIMEOUT_S)
        if not res.ok:
            raise TransportError(f"no file {remote} on node {node}")
        local.parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(local, "w", perms=0o600 if private else None) as fh:
            fh.write(res.stdout)

    def check_reachable(self, nodes: Iterable[str] | None = None) -> None:
        wanted = list(nodes if nodes is not None else self.exp.cluster.nodes)
        res = _run(["sinfo", "-h", "-N", "-o", "%N|%T"], timeout=QUERY_TIMEOUT_S).check("sinfo")
        states = dict(line.split("|", 1) for line in res.stdout.split() if "|" in line)
        bad = [
            f"{n} ({states.get(n, 'unknown to Slurm')})"
            for n in wanted
            if not re.match(r"(idle|mixed|allocated|completing)", states.get(n, ""))
        ]
        if bad:
            raise TransportError(f"Slurm nodes not usable: {', '.join(bad)}")

    def close(self) -> None:
        """End the held steps whose process is still running (a loop nobody stopped)."""
        for proc in self._held:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                proc.wait()
        self._held.clear()


def release_allocations(
    exp: Experiment,
    *,
    results_root: str | Path = "results",
    down: bool = False,
    services: Iterable[str] = (),
) -> list[str]:
    """scancel every allocation of this owner and run that holds no server or client step
    any more (a service of `servesweep up` keeps its allocation); returns the names released.

    `down` (`servesweep down`: the run's servers and this config's services are stopped):
    every allocation of the run that holds no service step, whatever else it still holds (a
    SIGKILLed run's client or sampling step), and each of `services` (job ids of allocations
    that held this config's services, `service_allocations`, under any RUN_ID) that holds no
    service step any more."""
    transport = SlurmTransport(exp, results_root=results_root)
    released, kept = [], []
    names = set(transport.allocation_names())
    prefix = f"{ALLOC_PREFIX}{transport.owner.tag}-"
    services = set(services)
    for alloc in squeue_jobs(prefix):
        if alloc.name not in names and alloc.job_id not in services:
            continue
        steps = squeue_steps(alloc.job_id).values()
        keep = SERVICE_MARK if down or alloc.name not in names else ""
        held = [n for n in steps if n.startswith(ALLOC_PREFIX) and n.endswith(keep)]
        if alloc.state == "RUNNING" and held:
            logger.info("slurm: allocation %s stays: it holds step %s", alloc.name, held[0])
            kept.append(alloc.name)
            continue
        _run(["scancel", alloc.job_id], timeout=QUERY_TIMEOUT_S)
        logger.info("slurm: released allocation %s (job %s)", alloc.name, alloc.job_id)
        released.append(alloc.name)
    # this run's files only (another run's service allocation may stay beside it)
    remove_head_files(
        f"{prefix}{exp.run_id}-", names=sorted(names), kept=[k for k in kept if k in names]
    )
    return released


def remove_head_files(prefix: str, *, names: list[str], kept: list[str]) -> None:
    """After a run's allocations are released: its files in head_dir() (the lock of each of
    its allocation `names`, each step's srun log: `prefix` + a launch's 12-digit digest) go,
    so nothing of the run stays under /tmp. While an allocation stays (`kept`: a service's),
    its lock and every srun log of the run stay."""
    if not head_dir().is_dir() or head_dir().is_symlink():
        return
    try:
        folder = private_head()  # a folder another user planted: nothing in it is touched
    except TransportError:
        return
    gone = {f"{name}.lock" for name in names if name not in kept}
    log = re.compile(re.escape(prefix) + r"[0-9a-f]{12}-.*\.srun\.log")
    for path in folder.iterdir():
        if path.name in gone or (not kept and log.fullmatch(path.name)):
            path.unlink(missing_ok=True)


def service_allocations(
    exp: Experiment, fingerprints: Iterable[str], *, results_root: str | Path = "results"
) -> list[str]:
    """Job ids of this owner's allocations (any RUN_ID) holding a service step of one of
    `fingerprints` (`servesweep down` releases them once the services are stopped)."""
    owner = current_owner(results_root)
    marks = [f"-{fp}-" for fp in fingerprints]
    return [
        alloc.job_id
        for alloc in squeue_jobs(f"{ALLOC_PREFIX}{owner.tag}-")
        if any(
            n.endswith(SERVICE_MARK) and any(m in n for m in marks)
            for n in squeue_steps(alloc.job_id).values()
        )
    ]


def allocation_lines(exp: Experiment, *, results_root: str | Path = "results") -> list[str]:
    """One line per allocation of this owner and run (`servesweep status`): name, job id,
    state, nodes and its steps (id and name)."""
    transport = SlurmTransport(exp, results_root=results_root)
    prefix = f"{ALLOC_PREFIX}{transport.owner.tag}-{exp.run_id}-"
    lines = []
    for alloc in squeue_jobs(prefix):
        steps = squeue_steps(alloc.job_id) if alloc.state == "RUNNING" else {}
        listed = ", ".join(f"{step} {name}" for step, name in steps.items()) or "none"
        lines.append(
            f"slurm allocation {alloc.name}: job {alloc.job_id} {alloc.state} on "
            f"{','.join(alloc.nodes) or '(pending)'}; steps: {listed}"
        )
    return lines


def time_limit_seconds(limit: str) -> float:
    """A Slurm `--time` value in seconds: minutes, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]."""
    days = 0
    if "-" in limit:
        head, limit = limit.split("-", 1)
        days = int(head)
        parts = [int(p) for p in limit.split(":")] + [0, 0]
        hours, minutes, seconds = parts[:3]
    else:
        parts = [int(p) for p in limit.split(":")]
        if len(parts) == 1:
            hours, minutes, seconds = 0, parts[0], 0
        elif len(parts) == 2:
            hours, minutes, seconds = 0, parts[0], parts[1]
        else:
            hours, minutes, seconds = parts
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def planned_allocations(exp: Experiment, *, results_root: str | Path = "results") -> list[str]:
    """The exact salloc line of each pool's allocation (`servesweep plan`)."""
    transport = SlurmTransport(exp, results_root=results_root)
    return [
        shlex.join(
            salloc_argv(
                name=transport.name_of(nodes),
                nodes=nodes,
                options=exp.cluster.slurm,
                gpus_per_node=exp.cluster.gpus_per_node,
            )
        )
        for nodes in transport.pools
    ]


# ------------------------------------------------------------------ runtime


def job_state(job: str) -> str:
    """An allocation's state and reason as Slurm tells them: `scontrol show job` (kept for
    MinJobAge after the end; a COMPLETING job is waited for up to STOP_GRACE_S, to tell
    CANCELLED, TIMEOUT or NODE_FAIL), else `sacct` (slurmdbd)."""
    deadline = time.monotonic() + STOP_GRACE_S
    while True:
        res = _run(["scontrol", "show", "job", "-o", job], timeout=QUERY_TIMEOUT_S)
        fields = dict(f.split("=", 1) for f in res.stdout.split() if "=" in f) if res.ok else {}
        if fields.get("JobState") != "COMPLETING" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if "JobState" not in fields:
        try:
            res = _run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "State,Reason"], timeout=60)
        except TransportError:  # no sacct on this machine
            res = CommandResult("head", "sacct", 1, "", "")
        state, _, reason = res.stdout.strip().partition("|") if res.ok else ("", "", "")
        fields = {"JobState": state, "Reason": reason} if state else {}
    if not fields:
        return "unknown to Slurm now (not in squeue, scontrol or sacct)"
    return f"{fields['JobState']}, reason {fields.get('Reason') or 'None'}"


def _parse(handle: str) -> tuple[str, str, int | None]:
    match = _HANDLE.fullmatch(handle)
    if match is None:
        raise TransportError(f"not a Slurm step handle: {handle!r}")
    pid = match.group("pid")
    return (
        match.group("job"),
        f"{match.group('job')}.{match.group('step')}",
        (int(pid) if pid else None),
    )


def _head_srun_alive(pid: int, job: str) -> bool:
    """Whether `pid` on the head still is a (non-zombie) srun of allocation `job`."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state != "Z" and b"srun" in cmdline[0] and f"--jobid={job}".encode() in cmdline


class SlurmRuntime:
    """Server ranks as long-lived steps started from the head; clients as blocking steps; the
    process in a step plain (`process`), in a pyxis container or `apptainer exec --nv`."""

    def __init__(
        self, transport: SlurmTransport, runtime: RuntimeConfig, *, image: str = ""
    ) -> None:
        if runtime.kind not in ("process", "pyxis", "apptainer"):
            raise ConfigError(f"runtime.kind: {runtime.kind} does not run on Slurm")
        self.transport = transport
        self.runtime = runtime
        self.image = image or runtime.image or ""

    # ---------------------------------------------------------- command lines
    def _container_flags(self, launch: Launch) -> list[str]:
        """srun's pyxis flags (image, mounts, the owner directory for one-shots)."""
        if self.runtime.kind != "pyxis":
            return []
        mounts = [*self.runtime.mounts]
        root = private_root(launch.log_path)
        if root is not None:
            mounts.append(f"{root}:{root}")
        if launch.cache_dir is not None:
            mounts.append(f"{launch.cache_dir}:{launch.cache_dir}")
        flags = [f"--container-image={self.image}"]
        if mounts:
            flags.append(f"--container-mounts={','.join(mounts)}")
        return flags

    def _gres(self, launch: Launch) -> list[str]:
        gpus = self.transport.options.gpus_per_node
        gpus = self.transport.exp.cluster.gpus_per_node if gpus is None else gpus
        return [f"--gres=gpu:{gpus}"] if gpus and launch.accelerators else ["--gres=none"]

    def _inner(self, launch: Launch, *, copy: bool = False) -> str:
        """The process inside the step: env (labels, variables), then argv (apptainer's exec
        around it), its output into the log on the node. `copy` (a server rank): the log is
        also followed to the step's stdout (`tail --pid`), so that the head-side srun keeps a
        copy that outlives the allocation (scancel, time limit, node down)."""
        argv = list(launch.argv)
        if self.runtime.kind == "apptainer":
            binds = [*self.runtime.mounts]
            root = private_root(launch.log_path)
            if root is not None:
                binds.append(f"{root}:{root}")
            if launch.cache_dir is not None:
                binds.append(f"{launch.cache_dir}:{launch.cache_dir}")
            bind = ["--bind", ",".join(binds)] if binds else []
            argv = ["apptainer", "exec", "--nv", *bind, self.image, *argv]
        assigns = env_assigns({**self.runtime.env, **launch.env, **label_env(launch.labels)})
        log = shlex.quote(launch.log_path)
        # pyxis mounts the cache before this shell runs (in the container): start() makes it
        cache = "" if self.runtime.kind == "pyxis" else launch_cache_prep(launch)
        prep = f"{read_secret_line(launch)}{node_dir_prep(launch.log_path)} && {cache}"
        if not copy:
            return f"{prep}exec env {assigns} {shlex.join(argv)} > {log} 2>&1 < /dev/null"
        return (
            f"{prep}: > {log} && {{ env {assigns} {shlex.join(argv)} > {log} 2>&1 "
            f"< /dev/null & pid=$!; tail -n +1 -F --pid=$pid {log} 2>/dev/null; wait $pid; }}"
        )

    def _step_line(self, launch: Launch, job: str, *, gpus: bool, copy: bool = False) -> str:
        extra = [*(self._gres(launch) if gpus else ["--gres=none"]), *self._container_flags(launch)]
        argv = step_argv(job, launch.node, name=step_name(launch), extra=extra)
        inner = self._inner(launch, copy=copy)
        return f"{shlex.join(argv)} /bin/sh -c {shlex.quote(inner)}"

    def _job_ref(self, node: str) -> str:
        """The allocation's job id, or (nothing reached yet) the squeue line that finds it."""
        name = self.transport.name_of(self.transport.pool_of(node))
        return f'"$(squeue -h -u {shlex.quote(_user())} -n {shlex.quote(name)} -o %i)"'

    def command_line(self, launch: Launch) -> str:
        line = self._step_line(launch, "JOB", gpus=True, copy=True)
        return line.replace("--jobid=JOB", f"--jobid={self._job_ref(launch.node)}", 1)

    def oneshot_line(self, launch: Launch, *, gpus: bool = False) -> str:
        line = self._step_line(launch, "JOB", gpus=gpus)
        return line.replace("--jobid=JOB", f"--jobid={self._job_ref(launch.node)}", 1)

    # ---------------------------------------------------------- images
    def import_line(self) -> str:
        """Shell: import `runtime.source` into the image path once, under a lock beside it
        (every node sees the path: the first import wins, the others find it present).
        Prints `imported` or `present`."""
        image = self.image
        part = f"{image}.partial"
        if self.runtime.kind == "pyxis":
            get = ["enroot", "import", "-o", part, self.runtime.source or ""]
        else:
            get = ["apptainer", "pull", part, self.runtime.source or ""]
        inner = (
            f"if [ -s {shlex.quote(image)} ]; then echo present; else rm -f {shlex.quote(part)} "
            f"&& {shlex.join(get)} && mv {shlex.quote(part)} {shlex.quote(image)} "
            f"&& echo imported; fi"
        )
        return (
            f'mkdir -p "$(dirname {shlex.quote(image)})" && '
            f"flock {shlex.quote(image + '.lock')} sh -c {shlex.quote(inner)}"
        )

    def acquire(self, *, node: str, log: Path, timeout: float) -> str:
        """The image on `node`: imported once (source) or required present; the method."""
        from servesweep.core.errors import SmokeFailed

        if self.runtime.source is None:
            res = self.transport.run(node, f"test -s {shlex.quote(self.image)}", timeout=60)
            if not res.ok and "/" in self.image:
                raise SmokeFailed(f"image {self.image} is not present on node {node}; log {log}")
            return "present"
        res = self.transport.run(node, self.import_line(), timeout=timeout)
        with log.open("a") as fh:
            fh.write(
                f"[import rc={res.returncode}] {self.import_line()}\n{res.stdout}{res.stderr}\n"
            )
        if not res.ok:
            tail = " | ".join((res.stderr or res.stdout).strip().splitlines()[-2:])
            raise SmokeFailed(
                f"image {self.image} could not be imported from {self.runtime.source} on node "
                f"{node} (exit {res.returncode}): {tail}; log {log}"
            )
        return (res.stdout.strip().splitlines() or ["imported"])[-1]

    def image_info(self, node: str) -> dict[str, object]:
        """What identifies the image file on `node`: size and modification time."""
        res = self.transport.run(
            node, f"stat -c '%s %Y' {shlex.quote(self.image)} 2>/dev/null", timeout=60
        )
        size, _, mtime = res.stdout.strip().partition(" ")
        if not res.ok or not mtime:
            return {"Id": None, "RepoDigests": [], "Created": None}
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(mtime)))
        return {"Id": f"file:{self.image}:{size}:{mtime}", "RepoDigests": [], "Created": stamp}

    # ---------------------------------------------------------- lifecycle
    def start(self, launch: Launch) -> str:
        job = self.transport.allocate(launch.node)
        if launch.cache_dir is not None and self.runtime.kind == "pyxis":
            # the container's mount source must exist (and be private) before the step
            res = self.transport.run(launch.node, cache_dir_prep(launch.cache_dir), timeout=60)
            if not res.ok:
                raise ServerStartError(
                    f"could not prepare the compile cache on node {launch.node}: "
                    f"{res.stderr.strip()}"
                )
        line = self._step_line(launch, job, gpus=True, copy=True)
        head_log = private_head() / f"{launch.name}.srun.log"
        with open_private(head_log, "w") as out:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", f"exec {line}"],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C to the run's group never reaches it
                text=True,
            )
        assert proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(secret_stdin(launch))
            proc.stdin.close()
        deadline = time.monotonic() + STEP_WAIT_S
        while time.monotonic() < deadline:
            for step, name in squeue_steps(job).items():
                if name == step_name(launch):
                    handle = f"{step}:{proc.pid}"
                    os.replace(head_log, self._head_copy(step))  # found by its handle
                    logger.info("node %s: started step %s (%s)", launch.node, handle, launch.name)
                    return handle
            if proc.poll() is not None:
                break
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        tail = " | ".join(head_log.read_text(errors="replace").strip().splitlines()[-3:])
        raise ServerStartError(
            f"could not start step {launch.name} on node {launch.node} (job {job}): "
            f"{tail or f'no step within {STEP_WAIT_S:.0f}s'}"
        )

    def is_running(self, node: str, handle: str) -> bool:
        """Its head-side srun alive, its allocation RUNNING (a cancelled or timed-out one
        lists its steps a while longer, completing) and its step listed."""
        job, step, pid = _parse(handle)
        if pid is not None and not _head_srun_alive(pid, job):
            return False
        state = _run(["squeue", "-h", "-j", job, "-o", "%T"], timeout=QUERY_TIMEOUT_S)
        return state.ok and state.stdout.strip() == "RUNNING" and step in squeue_steps(job)

    def _head_copy(self, step: str) -> Path:
        """The head-side srun's output of a rank's step: Slurm's own lines and a copy of the
        rank's log (`_inner`'s copy)."""
        return private_head() / f"{step}.srun.log"

    def logs(self, node: str, handle: str, log_path: str) -> str:
        """The log on the node, read in the allocation; once that is gone (or the file with
        it), the head's copy."""
        res = self.transport.run_existing(
            node, f"cat {shlex.quote(log_path)}", timeout=COMMAND_TIMEOUT_S
        )
        if res is not None and res.ok:
            return res.stdout
        copy = self._head_copy(_parse(handle)[1])
        return copy.read_text(errors="replace") if copy.is_file() else ""

    def ended(self, node: str, handle: str) -> str:
        """What Slurm says of a rank that is not running: its allocation's state and reason,
        and the last line slurmstepd or srun wrote of its step (e.g. `*** STEP 12.0 ON node4
        CANCELLED AT ... DUE TO TIME LIMIT ***`)."""
        job, step, _ = _parse(handle)
        copy = self._head_copy(step)
        text = copy.read_text(errors="replace") if copy.is_file() else ""
        told = [ln.strip() for ln in text.splitlines() if re.match(r"(slurmstepd|srun)\S*: ", ln)]
        told = [ln for ln in told if "***" in ln] or told  # `*** STEP ... DUE TO TIME LIMIT ***`
        return f"Slurm: job {job} {job_state(job)}" + (f"; {told[-1][:200]}" if told else "")

    def stop(self, node: str, handle: str) -> None:
        job, step, pid = _parse(handle)
        _run(["scancel", step], timeout=QUERY_TIMEOUT_S)
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline:
            gone = step not in squeue_steps(job)
            if gone and (pid is None or not _head_srun_alive(pid, job)):
                break
            time.sleep(0.2)
        if pid is not None and _head_srun_alive(pid, job):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        logger.info("node %s: cancelled step %s", node, step)

    def identity(self, node: str, handle: str) -> str:
        return handle if self.is_running(node, handle) else ""

    def host_pids(self, node: str, handle: str) -> set[int]:
        job, step, _ = _parse(handle)
        want_step = shlex.quote(f"SLURM_STEP_ID={step.split('.')[1]}")
        want_job = shlex.quote(f"SLURM_JOB_ID={job}")
        script = (
            "for p in /proc/[0-9]*; do "
            'e=$(tr "\\0" "\\n" < $p/environ 2>/dev/null) || continue; '
            f'printf "%s\\n" "$e" | grep -qxF {want_step}'
            f' && printf "%s\\n" "$e" | grep -qxF {want_job}'
            ' && echo "${p#/proc/}"; done; true'  # the loop's status is its last grep's
        )
        res = self.transport.run_existing(node, script, timeout=COMMAND_TIMEOUT_S)
        return {int(p) for p in res.stdout.split() if p.isdigit()} if res and res.ok else set()

    def owns(self, node: str, handle: str, labels: dict[str, str], identity: str) -> bool:
        job, step, pid = _parse(handle)
        if identity and identity != handle:
            return False
        name = squeue_steps(job).get(step)
        if name is None:  # the step is gone: only its head-side srun may be left
            return pid is not None and _head_srun_alive(pid, job)
        return all(f"-{v}-" in f"{name}-" for k, v in labels.items() if k in ("run", "fingerprint"))

    def run_oneshot(self, launch: Launch, *, timeout: float, gpus: bool = False) -> CommandResult:
        job = self.transport.allocate(launch.node)
        line = self._step_line(launch, job, gpus=gpus)
        try:
            proc = subprocess.run(
                ["/bin/sh", "-c", line],
                input=secret_stdin(launch),
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            for step, name in squeue_steps(job).items():
                if name == step_name(launch):
                    _run(["scancel", step], timeout=QUERY_TIMEOUT_S)
            raise TransportError(
                f"step {launch.name} timed out after {timeout:.0f}s on node {launch.node}"
            ) from None
        return CommandResult(launch.node, line, proc.returncode, proc.stdout, proc.stderr)

    def secret_env(self, node: str, handle: str, name: str) -> Secret | None:
        pids = sorted(self.host_pids(node, handle))
        for pid in pids:
            res = self.transport.run_existing(
                node, f"cat /proc/{pid}/environ 2>/dev/null", timeout=COMMAND_TIMEOUT_S
            )
            value = env_value(res.stdout, name) if res is not None and res.ok else None
            if value is not None:
                return value
        logger.warning(
            "node %s: no %s in the environment of step %s (pids %s)", node, name, handle, pids
        )
        return None

    def _scan(self, node: str, labels: dict[str, str]) -> list[tuple[str, dict[str, str]]]:
        """(step, labels) of every step process on `node` carrying all `labels`."""
        script = (
            "for p in /proc/[0-9]*; do "
            'e=$(tr "\\0" "\\n" < $p/environ 2>/dev/null) || continue; '
            f"if {_has_all(labels)}; then "
            'echo "@step $(printf "%s\\n" "$e" | sed -n "s/^SLURM_JOB_ID=//p")'
            '.$(printf "%s\\n" "$e" | sed -n "s/^SLURM_STEP_ID=//p") '
            '$(printf "%s\\n" "$e" | sed -n "s/^SLURMD_NODENAME=//p")"; '
            f'printf "%s\\n" "$e" | grep "^{ENV_LABEL_PREFIX}"; fi; done'
        )
        res = self.transport.run_existing(node, script, timeout=COMMAND_TIMEOUT_S)
        if res is None:
            return []
        found: dict[str, dict[str, str]] = {}
        current: dict[str, str] | None = None
        for line in res.stdout.splitlines():
            if line.startswith("@step "):
                fields = line.split()
                step = fields[1] if len(fields) > 1 else ""
                where = fields[2] if len(fields) > 2 else ""
                if not _HANDLE.fullmatch(step) or where != node or step in found:
                    current = None
                    continue
                current = found[step] = {}
            elif current is not None and "=" in line:
                key, value = line.removeprefix(ENV_LABEL_PREFIX).split("=", 1)
                current[key.lower()] = value
        return list(found.items())

    def _handles(self, steps: list[str]) -> dict[str, str]:
        """Each step's handle: `A.S:<pid>` when its srun runs on this head, else `A.S`."""
        names: dict[str, str] = {}
        for job in dict.fromkeys(step.split(".")[0] for step in steps):
            names |= squeue_steps(job)
        wanted = {
            (f"--jobid={step.split('.')[0]}".encode(), f"--job-name={names[step]}".encode()): step
            for step in steps
            if step in names
        }
        out = dict(zip(steps, steps, strict=True))
        # srun forks a helper with the same argv: the first (lowest) pid is the one started
        for proc in sorted(Path("/proc").glob("[0-9]*"), key=lambda p: int(p.name)):
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if not argv or not argv[0].endswith(b"srun"):
                continue
            for (job, name), step in wanted.items():
                if out[step] != step:
                    continue  # its srun was found (the helper comes later)
                if (
                    job in argv
                    and name in argv
                    and _head_srun_alive(int(proc.name), job[8:].decode())
                ):
                    out[step] = f"{step}:{proc.name}"
        return out

    def find(self, node: str, labels: dict[str, str]) -> list[str]:
        steps = [step for step, _ in self._scan(node, labels)]
        return list(self._handles(steps).values())

    def labelled(self, node: str, labels: dict[str, str]) -> list[Labelled]:
        found = self._scan(node, labels)
        handles = self._handles([step for step, _ in found])
        return [Labelled(node, handles[step], labels) for step, labels in found]
