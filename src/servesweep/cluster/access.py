"""How a run reaches its nodes: one Cluster (a transport, the runtime on every node, and what
their kinds mean for the rest of the package), built in one place."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from servesweep.cluster.runtime import DockerRuntime, ProcessRuntime, Runtime
from servesweep.cluster.secrets import sudo_password
from servesweep.cluster.transport import LocalTransport, MixedTransport, Transport
from servesweep.config.experiment import Experiment


@dataclass(frozen=True)
class Cluster:
    """The nodes of a run as the code above this layer sees them: run commands through
    `transport`, start processes through `runtime`, and ask the facts below rather than the
    configured kinds."""

    transport: Transport
    runtime: Runtime
    local: bool  # the nodes are this machine (cluster.transport local)
    containers: bool  # servers and clients run in docker containers (runtime.kind docker)

    @property
    def shares_run_folder(self) -> bool:
        """A process on a node can write straight into the run folder (local processes);
        otherwise its files are written on the node and copied back."""
        return self.local and not self.containers

    def close(self) -> None:
        self.transport.close()


def open_cluster(exp: Experiment, *, for_commands: bool = False) -> Cluster:
    """The experiment's cluster over a fresh transport. `for_commands`: only command lines are
    made (`servesweep commands`): nothing is reached and no password is read."""
    local = exp.cluster.local
    if exp.cluster.transport == "slurm":
        from servesweep.cluster.slurm import SlurmRuntime, SlurmTransport

        slurm = SlurmTransport(exp)
        return Cluster(slurm, SlurmRuntime(slurm, exp.runtime), local=False, containers=False)
    transport: Transport
    if local or for_commands:
        transport = LocalTransport()
    else:
        from servesweep.cluster.ssh import SshTransport  # only SSH clusters need paramiko

        here = set(exp.cluster.local_nodes)
        ssh = SshTransport(exp.cluster.ssh, nodes=[n for n in exp.cluster.nodes if n not in here])
        transport = MixedTransport(local=here, remote=ssh) if here else ssh
    runtime: Runtime
    if not exp.runtime.containers:
        runtime = ProcessRuntime(transport, env=exp.runtime.env)
    else:
        password = (
            sudo_password(os.environ, default_file=exp.secrets.sudo_password_file)
            if exp.runtime.sudo and not for_commands
            else None
        )
        runtime = DockerRuntime(
            transport, exp.runtime, sudo_password=password, gpus=exp.runtime.gpus
        )
    return Cluster(transport, runtime, local=local, containers=exp.runtime.containers)


def release(exp: Experiment, *, down: bool = False, services: Iterable[str] = ()) -> list[str]:
    """Give back what the run holds on its cluster beyond its servers (its Slurm allocations;
    nothing for local and SSH clusters): onsuccess/onerror and `servesweep down` (`down`:
    whatever steps are left, and `services`, from `service_holdings`)."""
    if exp.cluster.transport != "slurm":
        return []
    from servesweep.cluster.slurm import release_allocations

    return release_allocations(exp, down=down, services=services)


def service_holdings(exp: Experiment, fingerprints: Iterable[str]) -> list[str]:
    """What holds the services of `fingerprints` on the cluster beyond their processes (the
    Slurm allocations they run in, under any RUN_ID; nothing for local and SSH clusters)."""
    if exp.cluster.transport != "slurm":
        return []
    from servesweep.cluster.slurm import service_allocations

    return service_allocations(exp, fingerprints)


def holdings(exp: Experiment) -> list[str]:
    """Lines on what the run holds on its cluster beyond its servers (its Slurm allocations
    and their steps; nothing for local and SSH clusters): `servesweep status`."""
    if exp.cluster.transport != "slurm":
        return []
    from servesweep.cluster.slurm import allocation_lines

    return allocation_lines(exp)


@contextlib.contextmanager
def connected(exp: Experiment) -> Iterator[Cluster]:
    """`open_cluster(exp)`, its connections closed on exit."""
    cluster = open_cluster(exp)
    try:
        yield cluster
    finally:
        cluster.close()
