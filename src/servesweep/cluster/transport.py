"""Run a command or copy a file on a node: the Transport protocol, results, Local (subprocess).

SSH (paramiko) lives in servesweep.cluster.ssh, imported only when a cluster uses it."""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from servesweep.core.errors import TransportError
from servesweep.core.files import atomic_open

T = TypeVar("T")

if TYPE_CHECKING:  # pydantic stays out of a bare GPU host (benchmarks/gpu_sampler_check.py)
    from servesweep.config.schema import ClusterConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommandResult:
    """What one shell command on one node returned."""

    node: str
    command: str
    returncode: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def check(self, what: str) -> CommandResult:
        """Raise TransportError naming the node if the command failed."""
        if not self.ok:
            tail = (self.stderr or self.stdout).strip().splitlines()[-3:]
            raise TransportError(
                f"{what} failed on node {self.node} (exit {self.returncode}): {' | '.join(tail)}"
            )
        return self


class Transport(Protocol):
    """Runs shell commands and moves files on cluster nodes."""

    def run(
        self, node: str, command: str, *, timeout: float, stdin: str | None = None
    ) -> CommandResult:
        """Run `command` with a POSIX shell on `node`; `stdin` is fed and never logged."""
        ...

    def run_background(self, node: str, command: str, *, timeout: float) -> CommandResult:
        """Run `command`, which starts a background process and prints its pid, so that the
        process outlives this call (as `run` where a node keeps what a command leaves running;
        Slurm ends a step's processes with the step, so there the step is held open)."""
        ...

    def put(self, node: str, local: Path, remote: str) -> None:
        """Copy a local file to `remote` on `node`."""
        ...

    def get(self, node: str, remote: str, local: Path, *, private: bool = False) -> None:
        """Copy `remote` on `node` to a local file (`private`: mode 0600 from its creation,
        for a file that may hold a secret)."""
        ...

    def check_reachable(self, nodes: Iterable[str] | None = None) -> None:
        """Raise TransportError naming every node that cannot be reached."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...


def _perms(private: bool) -> int | None:
    """A copied file's mode: 0600 for a private one, else what a plain open() gives."""
    return 0o600 if private else None


def node_address(cluster: ClusterConfig, node: str) -> str:
    """The address other nodes and the client use for `node`: `cluster.addresses`, else
    127.0.0.1 locally, else the HostName of its `~/.ssh/config` alias."""
    if node in cluster.addresses:
        return cluster.addresses[node]
    if cluster.local:
        return "127.0.0.1"
    if cluster.transport == "slurm":
        return slurm_node_addr(node)
    path = Path(cluster.ssh.config_file).expanduser()
    if not path.is_file():
        return node
    import paramiko  # only clusters reached over SSH need it

    return paramiko.SSHConfig.from_path(str(path)).lookup(node).get("hostname", node)


def slurm_node_addr(node: str) -> str:
    """A Slurm node's NodeAddr (`scontrol show node`), else its name."""
    try:
        proc = subprocess.run(
            ["scontrol", "show", "node", node], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return node
    match = re.search(r"\bNodeAddr=(\S+)", proc.stdout) if proc.returncode == 0 else None
    return match.group(1) if match else node


def fan_out(nodes: Iterable[str], work: Callable[[str], T]) -> dict[str, T | Exception]:
    """`work(node)` on every node in parallel, one thread each; results (or the exception a
    node raised) keyed by node, in order."""
    nodes = list(nodes)
    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        futures = {n: pool.submit(work, n) for n in nodes}
        out: dict[str, T | Exception] = {}
        for n, f in futures.items():
            exc = f.exception()
            out[n] = exc if isinstance(exc, Exception) else f.result()
        return out


def run_all(
    transport: Transport, nodes: Iterable[str], command: str, *, timeout: float
) -> dict[str, CommandResult]:
    """Run the same command on every node in parallel; results keyed by node, in order."""
    nodes = list(nodes)
    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        futures = {n: pool.submit(transport.run, n, command, timeout=timeout) for n in nodes}
        return {n: f.result() for n, f in futures.items()}


class LocalTransport:
    """Every node is this machine: commands run through /bin/sh."""

    def run(
        self, node: str, command: str, *, timeout: float, stdin: str | None = None
    ) -> CommandResult:
        try:
            proc = subprocess.run(
                ["/bin/sh", "-c", command],
                input=stdin if stdin is not None else "",  # never the caller's own stdin
                capture_output=True,
                text=True,
                errors="replace",  # a log may hold any bytes (a native library's)
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise TransportError(
                f"command timed out after {timeout:.0f}s on node {node}: {command[:120]}"
            ) from None
        return CommandResult(node, command, proc.returncode, proc.stdout, proc.stderr)

    def run_background(self, node: str, command: str, *, timeout: float) -> CommandResult:
        return self.run(node, command, timeout=timeout)

    def put(self, node: str, local: Path, remote: str) -> None:
        Path(remote).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local, remote)

    def get(self, node: str, remote: str, local: Path, *, private: bool = False) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(remote, "rb") as src, atomic_open(local, "wb", perms=_perms(private)) as dst:
                shutil.copyfileobj(src, dst)
        except FileNotFoundError:
            raise TransportError(f"no file {remote} on node {node}") from None

    def check_reachable(self, nodes: Iterable[str] | None = None) -> None:
        return None

    def close(self) -> None:
        return None


class MixedTransport:
    """Some nodes are this machine (`local`), the others are reached through `remote` (SSH):
    each call goes to the transport of its node."""

    def __init__(self, *, local: Iterable[str], remote: Transport) -> None:
        self.local_nodes = frozenset(local)
        self.here = LocalTransport()
        self.remote = remote

    def _of(self, node: str) -> Transport:
        return self.here if node in self.local_nodes else self.remote

    def run(
        self, node: str, command: str, *, timeout: float, stdin: str | None = None
    ) -> CommandResult:
        return self._of(node).run(node, command, timeout=timeout, stdin=stdin)

    def run_background(self, node: str, command: str, *, timeout: float) -> CommandResult:
        return self._of(node).run_background(node, command, timeout=timeout)

    def put(self, node: str, local: Path, remote: str) -> None:
        self._of(node).put(node, local, remote)

    def get(self, node: str, remote: str, local: Path, *, private: bool = False) -> None:
        self._of(node).get(node, remote, local, private=private)

    def check_reachable(self, nodes: Iterable[str] | None = None) -> None:
        if nodes is None:
            self.remote.check_reachable(None)
            return
        others = [n for n in nodes if n not in self.local_nodes]
        if others:
            self.remote.check_reachable(others)

    def close(self) -> None:
        self.remote.close()
