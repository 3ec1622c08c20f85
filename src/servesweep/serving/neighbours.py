"""Who else holds a node a server set needs: this run's other pools, or another owner
(found by the labels on the node; the plan's disjoint pools are not trusted alone)."""

from __future__ import annotations

from servesweep.cluster.owner import (
    KIND_LABEL,
    OWNER_LABEL,
    POOL_LABEL,
    PORTS_LABEL,
    RUN_LABEL,
    SERVER_KIND,
    Owner,
)
from servesweep.cluster.runtime import Labelled, Runtime
from servesweep.config.experiment import Experiment
from servesweep.config.matrix import ServerSpec
from servesweep.core.errors import NodeShared, ServerConflict
from servesweep.serving.engines import listening_ports
from servesweep.serving.launches import spec_nodes


def shared_nodes(
    runtime: Runtime, exp: Experiment, spec: ServerSpec, *, owner: Owner, pool: int
) -> list[Labelled]:
    """Server processes of this run's other pools on a node `spec` needs."""
    found = []
    mine = {KIND_LABEL: SERVER_KIND, RUN_LABEL: exp.run_id, **owner.labels()}
    for node in spec_nodes(spec):
        for other in runtime.labelled(node, mine):
            if other.labels.get("node", node) != node:
                continue  # one machine or one dockerd serving several test nodes
            if other.labels.get(POOL_LABEL, "0") != str(pool):
                found.append(other)
    return found


def check_nodes_free(
    runtime: Runtime, exp: Experiment, spec: ServerSpec, *, owner: Owner, pool: int
) -> None:
    """NodeShared naming the node and the pool whose server holds it."""
    found = shared_nodes(runtime, exp, spec, owner=owner, pool=pool)
    if found:
        other = found[0]
        raise NodeShared(
            f"server {spec.id} of pool {pool}: node {other.node} holds server "
            f"{other.labels.get('server', '?')} of pool {other.labels.get(POOL_LABEL, '?')} "
            f"(handle {other.handle[:12]}); no two server sets share a node"
        )


def foreign(runtime: Runtime, exp: Experiment, spec: ServerSpec, *, owner: Owner) -> list[Labelled]:
    """Servers of other owners in the way of `spec`: on a node it needs (a real engine
    needs the node's GPUs), or holding one of its ports (the sim shares a machine)."""
    needed = listening_ports(exp, spec)
    found = []
    for node in spec_nodes(spec):
        ports = {p for n, p in needed if n == node}
        for other in runtime.labelled(node, {KIND_LABEL: SERVER_KIND}):
            if other.labels.get(OWNER_LABEL) == owner.label:
                continue
            if other.labels.get("node", node) != node:
                continue  # one machine or one dockerd serving several test nodes
            held = {int(p) for p in other.labels.get(PORTS_LABEL, "").split(",") if p}
            if exp.engine.kind != "sim" or held & ports:
                found.append(other)
    return found


def check_foreign(runtime: Runtime, exp: Experiment, spec: ServerSpec, *, owner: Owner) -> None:
    """One-line error naming the owner of a server that is in `spec`'s way."""
    found = foreign(runtime, exp, spec, owner=owner)
    if found:
        raise ServerConflict(describe_conflict(found[0], spec_id=spec.id))


def describe_server(other: Labelled) -> str:
    """`node N: server S (run R, ports P, handle H) of owner O`, from its labels."""
    labels = other.labels
    return (
        f"node {other.node}: server {labels.get('server', '?')} (run {labels.get(RUN_LABEL, '?')}"
        f", ports {labels.get(PORTS_LABEL) or '?'}, handle {other.handle[:12]}) of owner "
        f"{labels.get(OWNER_LABEL, 'unknown')}"
    )


def describe_conflict(other: Labelled, *, spec_id: str) -> str:
    """One line: whose server is in the way, where, and how to remove it."""
    return (
        f"{describe_server(other)} is in the way of server {spec_id}; ask its owner or remove "
        f"it with `servesweep down --force`"
    )
