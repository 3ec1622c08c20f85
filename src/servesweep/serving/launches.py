"""What a server set runs: its labels, each rank's launch and commands.sh, its ports and nodes
(pure: nothing here starts or touches a node)."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Callable

from servesweep.cluster.owner import (
    KIND_LABEL,
    POOL_LABEL,
    PORTS_LABEL,
    RUN_LABEL,
    SERVER_KIND,
    SERVICE_LABEL,
    Owner,
)
from servesweep.cluster.runtime import (
    Launch,
    Runtime,
    compile_cache_dir,
    compile_cache_env,
    owner_dir,
)
from servesweep.cluster.secrets import Secret
from servesweep.config.experiment import Experiment
from servesweep.config.matrix import ServerSpec
from servesweep.serving.engines import (
    API_KEY_ENV,
    ROUTER_ROLE,
    RankCommand,
    base_url,
    listening_ports,
    rank_commands,
    role_url,
)


def server_labels(
    exp: Experiment, owner: Owner, pool: int, spec: ServerSpec | None = None, *, service: bool
) -> dict[str, str]:
    """Labels of an owner's servers: kind, run, pool and owner (+ fingerprint of `spec`, and
    the service label when `servesweep up` starts it)."""
    labels = {
        KIND_LABEL: SERVER_KIND,
        RUN_LABEL: exp.run_id,
        POOL_LABEL: str(pool),
        **owner.labels(),
    }
    if spec is not None:
        labels |= {"fingerprint": spec.fingerprint}
        if service:
            labels |= {SERVICE_LABEL: spec.fingerprint}
    return labels


def run_node_dir(exp: Experiment, owner: Owner) -> str:
    """This owner's and run's directory on a node: two checkouts never share it."""
    return f"{owner_dir(owner.tag)}/{exp.run_id}"


def node_cache_dir(exp: Experiment, owner: Owner) -> str | None:
    """The compile-cache folder of this config's image on every node (None: turned off)."""
    return compile_cache_dir(exp.runtime, engine_version=exp.engine.version, owner_tag=owner.tag)


def rank_launches(
    exp: Experiment,
    spec: ServerSpec,
    *,
    labels: dict[str, str],
    owner: Owner,
    pool: int,
    log_path: Callable[[str, str], str],
    key: Secret | None = None,
) -> list[tuple[RankCommand, Launch]]:
    """Every process of a server set in start order, with its launch (a keyed process gets
    `key` in API_KEY_ENV through stdin). `log_path(role, node)`: where it writes its log."""
    out = []
    ports = listening_ports(exp, spec)
    cache = node_cache_dir(exp, owner)
    for cmd in rank_commands(exp, spec):
        engine = cmd.role != ROUTER_ROLE
        cached = cache if engine else None
        launch = Launch(
            name=(
                f"servesweep-{owner.tag}-{exp.run_id}-{spec.fingerprint}-"
                f"{cmd.role}-r{cmd.rank}{'' if pool == 0 else f'-pool_{pool}'}"
            ),
            node=cmd.node,
            argv=cmd.argv,
            log_path=log_path(cmd.role, cmd.node),
            # a server's own variables win over the cache's
            env={**(compile_cache_env(cached) if cached else {}), **cmd.env},
            cache_dir=cached,
            labels=labels
            | {
                "server": spec.id,
                "role": cmd.role,
                "rank": str(cmd.rank),
                "node": cmd.node,
                PORTS_LABEL: ",".join(str(p) for n, p in ports if n == cmd.node),
            },
            accelerators=engine,
            secret_env=(API_KEY_ENV, key or Secret("")) if cmd.keyed else None,
        )
        out.append((cmd, launch))
    return out


def commands_script(
    spec: ServerSpec, launches: list[tuple[RankCommand, Launch]], runtime: Runtime
) -> str:
    """service/<server>/commands.sh: the exact command run on each node, in start order."""
    lines = ["#!/bin/sh", f"# server {spec.id} fingerprint {spec.fingerprint}"]
    for cmd, launch in launches:
        lines.append(f"# role {cmd.role} rank {cmd.rank} node {cmd.node}")
        lines.append(runtime.command_line(launch))
    return "\n".join(lines) + "\n"


def rank_url(exp: Experiment, spec: ServerSpec, cmd: RankCommand) -> str | None:
    """The URL a rank answers on: the router's or a role's rank 0 (None: other ranks)."""
    if cmd.role == ROUTER_ROLE:
        return base_url(exp, spec)
    if cmd.rank != 0:
        return None
    return role_url(exp, next(r for r in spec.roles if r.name == cmd.role))


def spec_nodes(spec: ServerSpec) -> list[str]:
    """Every node a server set runs a process on (roles' nodes, then the router's)."""
    return list(
        dict.fromkeys(
            [
                *(n for r in spec.roles for n in r.nodes),
                *([spec.router.node] if spec.router else []),
            ]
        )
    )


def resolve_ports(spec: ServerSpec) -> ServerSpec:
    """`spec` with every "auto" port (AUTO_PORT) replaced by a port free on this machine
    (config allows "auto" only with the local transport)."""
    roles = tuple(
        dataclasses.replace(
            role,
            port=role.port or free_port(),
            dist_init_port=role.dist_init_port or free_port(),
        )
        for role in spec.roles
    )
    router = spec.router
    if router is not None and router.port == "auto":
        router = router.model_copy(update={"port": free_port()})
    return dataclasses.replace(spec, roles=roles, router=router)


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (bind port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
