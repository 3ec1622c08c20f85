"""The experiment model: its sections, cross-section checks and topology (node pools, roles)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import Field, model_validator

from servesweep.config.guesses import unknown as unknown_guesses
from servesweep.config.schema import (
    NAME_PATTERN,
    PD_ROLES,
    SINGLE_ROLE,
    ClientConfig,
    ClusterConfig,
    EngineConfig,
    EquivalenceConfig,
    EvidencePattern,
    GateRule,
    Matrix,
    PlotsConfig,
    PreflightConfig,
    ReferenceConfig,
    RoleConfig,
    RouterConfig,
    RuntimeConfig,
    SecretsConfig,
    ServerArgs,
    SloConfig,
    Strict,
    TelemetryConfig,
    ValidationConfig,
    Workload,
    combinations,
    validated,
)


class Experiment(Strict):
    """One experiment: cluster, runtime, engine, server args, matrix, workload, repeats."""

    run_id: str = Field(pattern=NAME_PATTERN)
    site: str | None = None  # config/site/<site>.yaml under this file (servesweep.config.site)
    cluster: ClusterConfig
    runtime: RuntimeConfig = RuntimeConfig()
    secrets: SecretsConfig = SecretsConfig()
    preflight: PreflightConfig = PreflightConfig()
    engine: EngineConfig
    client: ClientConfig = ClientConfig()
    validation: ValidationConfig = ValidationConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    equivalence: EquivalenceConfig = EquivalenceConfig()
    slo: SloConfig = SloConfig()
    plots: PlotsConfig = PlotsConfig()
    server: ServerArgs = ServerArgs()
    matrix: Matrix = Matrix()
    workload: Workload
    roles: dict[str, RoleConfig] = Field(default_factory=dict)
    router: RouterConfig | None = None
    cases: dict[str, dict[str, Any]] = Field(default_factory=dict)
    suites: dict[str, list[str]] = Field(default_factory=dict)
    suite: str | None = None
    warmup_after_start: int = Field(default=0, ge=0)
    evidence: dict[str, EvidencePattern] = Field(default_factory=dict)
    repeats: int = Field(default=1, ge=1)
    baseline: dict[str, Any] = Field(default_factory=dict)
    reference: ReferenceConfig | None = None
    # Absolute bounds per case or cell: a miss fails the run, named (analysis.verdict).
    gate: list[GateRule] = Field(default_factory=list)
    # Dotted keys of values nobody has confirmed on the cluster (servesweep.config.guesses):
    # listed, observed and recorded, never enforced. A site file's guesses join them.
    guesses: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check_combinations(self) -> Experiment:
        self._check_roles()
        self._check_transport()
        missing = unknown_guesses(self.model_dump(mode="json"), self.guesses)
        if missing:
            raise ValueError(f"guesses: {missing[0]!r} names no config key")
        node_pools(self)
        _check_gpu_overlaps(self)
        for axes in combinations(self.matrix.server):
            for role in role_layouts(self):
                args = validated(ServerArgs, role.base, axes, "matrix.server")
                world = len(role.nodes) * self.cluster.gpus_per_node
                if args.tp_size * args.pp_size != world:
                    prefix = "server" if role.name == SINGLE_ROLE else f"roles.{role.name}.server"
                    raise ValueError(
                        f"{prefix}.tp_size: tp_size*pp_size = {args.tp_size}*{args.pp_size} "
                        f"must equal nodes*gpus_per_node = "
                        f"{len(role.nodes)}*{self.cluster.gpus_per_node}"
                    )
            if self.roles:
                _check_pd_pair(self, axes)
                _check_shared_memory(self, axes)
        for axes in combinations(self.matrix.client):
            validated(Workload, self.workload, axes, "matrix.client")
        self._check_cases()
        self._check_gate()
        if self.reference is not None and not self.cases:
            raise ValueError("reference: compares cases: give `cases`")
        roles = {*self.roles, "router"} if self.roles else {SINGLE_ROLE}
        for name, pattern in self.evidence.items():
            if pattern.role not in roles:
                raise ValueError(
                    f"evidence.{name}.role: {pattern.role!r} is not a role of this experiment "
                    f"({sorted(roles)})"
                )
        if len(self.baseline) > 1:
            raise ValueError("baseline: name exactly one axis and its value")
        for axis, value in self.baseline.items():
            values = self.matrix.server.get(axis, self.matrix.client.get(axis))
            if values is None:
                raise ValueError(f"baseline.{axis}: not a matrix axis")
            if value not in values:
                raise ValueError(f"baseline.{axis}: {value!r} is not in the matrix {values}")
        return self

    def _check_transport(self) -> None:
        kind, transport = self.runtime.kind, self.cluster.transport
        if self.runtime.slurm_container and transport != "slurm":
            raise ValueError(
                f"runtime.kind: {kind} needs cluster.transport slurm (got {transport})"
            )
        if transport == "slurm" and kind == "docker":
            raise ValueError(
                "runtime.kind: docker does not run under cluster.transport slurm "
                "(use pyxis, apptainer or process)"
            )

    def _check_roles(self) -> None:
        ports = {
            "engine.port": self.engine.port,
            "engine.dist_init_port": self.engine.dist_init_port,
        }
        for name, role in self.roles.items():
            ports |= {
                f"roles.{name}.port": role.port,
                f"roles.{name}.dist_init_port": role.dist_init_port,
            }
        if self.router is not None:
            ports["router.port"] = self.router.port
        auto = [key for key, port in ports.items() if port == "auto"]
        if auto and not self.cluster.local:
            raise ValueError(f"{auto[0]}: 'auto' needs cluster.transport local (give a number)")
        if not self.roles:
            if self.router is not None:
                raise ValueError("router: needs roles prefill and decode")
            return
        if sorted(self.roles) != sorted(PD_ROLES):
            raise ValueError(f"roles: exactly {list(PD_ROLES)} (got {sorted(self.roles)})")
        if self.router is None:
            raise ValueError("router: required with PD roles (clients talk to the router)")
        known = set(self.cluster.nodes)
        for name, role in self.roles.items():
            unknown = [n for n in role.nodes if n not in known]
            if unknown:
                raise ValueError(f"roles.{name}.nodes: {unknown} not in cluster.nodes")
            bad = sorted(set(role.server) - set(ServerArgs.model_fields))
            if bad:
                raise ValueError(f"roles.{name}.server.{bad[0]}: unknown key")
        if self.router.node not in known:
            raise ValueError(f"router.node: {self.router.node!r} not in cluster.nodes")

    def _check_cases(self) -> None:
        if self.cases and self.matrix.client:
            raise ValueError("cases: give either cases or matrix.client axes, not both")
        for name, overrides in self.cases.items():
            if not re.match(NAME_PATTERN, name):
                raise ValueError(f"cases.{name}: names are letters, digits, '.', '_', '-'")
            validated(Workload, self.workload, overrides, f"cases.{name}")
        for suite, names in self.suites.items():
            missing = [n for n in names if n not in self.cases]
            if missing or not names:
                raise ValueError(f"suites.{suite}: unknown or no cases {missing}")
        if self.suite is not None and self.suite not in {*self.suites, "all"}:
            raise ValueError(f"suite: {self.suite!r} is not one of {[*self.suites, 'all']}")

    def _check_gate(self) -> None:
        """Every `where` names an axis of this experiment and one of its values."""
        axes = {**self.matrix.server, **self.matrix.client}
        if self.cases:
            axes["case"] = list(self.cases)
        for i, rule in enumerate(self.gate):
            for axis, value in rule.where.items():
                if axis not in axes:
                    raise ValueError(
                        f"gate[{i}].where.{axis}: not an axis of this experiment {sorted(axes)}"
                    )
                if value not in axes[axis]:
                    raise ValueError(f"gate[{i}].where.{axis}: {value!r} is not in {axes[axis]}")


# ---------------------------------------------------- node pools (servesweep.cluster.pools)

# profiles/default declares one resource per pool, pool_0 .. pool_15 (each = 1).
MAX_POOLS = 16


@dataclass(frozen=True)
class Pool:
    """One node set; `nodes` in the template's order."""

    index: int
    nodes: tuple[str, ...]

    @property
    def resource(self) -> str:
        return resource_name(self.index)


def resource_name(index: int) -> str:
    """The Snakemake resource of pool `index` (one server set at a time)."""
    return f"pool_{index}"


def template_nodes(exp: Experiment) -> tuple[str, ...]:
    """The nodes one server set of the configured topology uses, in position order."""
    if not exp.roles:
        return tuple(exp.cluster.nodes[: exp.cluster.nodes_per_server])
    names = [*exp.roles["prefill"].nodes, *exp.roles["decode"].nodes]
    if exp.router is not None:
        names.append(exp.router.node)
    return tuple(dict.fromkeys(names))


def node_pools(exp: Experiment) -> list[Pool]:
    """The pools of an experiment (one without `cluster.pools`); ValueError names the key."""
    cluster = exp.cluster
    template = template_nodes(exp)
    size = len(template)
    if exp.roles and cluster.nodes_per_server not in (None, size):
        raise ValueError(
            f"cluster.nodes_per_server: {cluster.nodes_per_server}, but the PD roles and router "
            f"use {size} nodes ({', '.join(template)})"
        )
    if cluster.pools is None:
        sets = [template]
    elif cluster.pools == "auto":
        rest = [n for n in cluster.nodes if n not in template]
        sets = [
            template,
            *(tuple(rest[i : i + size]) for i in range(0, len(rest) - size + 1, size)),
        ]
    else:
        sets = [tuple(p) for p in cluster.pools]
        seen: dict[str, int] = {}
        for i, nodes in enumerate(sets):
            if len(nodes) != size:
                raise ValueError(
                    f"cluster.pools: pool {i} has {len(nodes)} nodes, one server set needs {size} "
                    f"({', '.join(template)})"
                )
            unknown = [n for n in nodes if n not in cluster.nodes]
            if unknown:
                raise ValueError(f"cluster.pools: pool {i}: {unknown} not in cluster.nodes")
            for node in nodes:
                if node in seen:
                    raise ValueError(
                        f"cluster.pools: node {node} is in pool {seen[node]} and pool {i}; "
                        f"pools must not share a node"
                    )
                seen[node] = i
    if not sets:
        raise ValueError("cluster.pools: no pool given")
    if len(sets) > MAX_POOLS:
        raise ValueError(f"cluster.pools: {len(sets)} pools, at most {MAX_POOLS}")
    return [Pool(i, nodes) for i, nodes in enumerate(sets)]


# A port given as "auto" in RoleLayout/RoleSpec until ServerManager.start picks a free one.
AUTO_PORT = 0


def port_number(port: int | str) -> int:
    """A configured port as a number (AUTO_PORT for "auto")."""
    return AUTO_PORT if port == "auto" else int(port)


@dataclass(frozen=True)
class RoleLayout:
    """Where one role runs and its base arguments (before matrix axes)."""

    name: str
    nodes: tuple[str, ...]
    port: int
    dist_init_port: int
    base: ServerArgs


def role_layouts(exp: Experiment) -> list[RoleLayout]:
    """The roles of every server set: one `server` role, or prefill then decode."""
    if not exp.roles:
        return [
            RoleLayout(
                SINGLE_ROLE,
                template_nodes(exp),
                port_number(exp.engine.port),
                port_number(exp.engine.dist_init_port),
                exp.server,
            )
        ]
    layouts = []
    for name in PD_ROLES:
        role = exp.roles[name]
        base = validated(ServerArgs, exp.server, role.server, f"roles.{name}.server")
        layouts.append(
            RoleLayout(
                name,
                tuple(role.nodes),
                port_number(role.port if role.port is not None else exp.engine.port),
                port_number(
                    role.dist_init_port
                    if role.dist_init_port is not None
                    else exp.engine.dist_init_port
                ),
                base,
            )
        )
    return layouts


def _check_pd_pair(exp: Experiment, axes: dict[str, Any]) -> None:
    """Prefill and decode must agree on what a KV transfer needs (SGLang refuses otherwise)."""
    args = {
        r.name: validated(ServerArgs, r.base, axes, f"roles.{r.name}") for r in role_layouts(exp)
    }
    for key, what in (("page_size", "KV page size"), ("kv_cache_dtype", "KV cache dtype")):
        p, d = getattr(args["prefill"], key), getattr(args["decode"], key)
        if p != d:
            raise ValueError(
                f"roles.decode.server.{key}: {d!r} differs from prefill's {p!r}; the {what} "
                f"must be equal on P and D (SGLang fails the first transfer: "
                f"'{'Page size' if key == 'page_size' else 'KV cache dtype'} mismatch')"
            )


def json_schema() -> dict[str, Any]:
    """JSON Schema of an experiment file, generated from the typed models."""
    return Experiment.model_json_schema()


# ------------------------------------------------------ GPUs of one host (cluster.gpu_ids)

# The most of a shared GPU's memory that the processes sharing it may claim together (the sum
# of their mem_fraction_static): the rest holds two CUDA contexts, graphs and activations.
MAX_SHARED_MEM_FRACTION = 0.95


def pool_roles(exp: Experiment) -> list[dict[str, set[str]]]:
    """Per node pool (one server set each): node -> the PD roles it runs there ({} without
    PD roles)."""
    template = template_nodes(exp)
    out = []
    for pool in node_pools(exp):
        place = dict(zip(template, pool.nodes, strict=True))
        roles: dict[str, set[str]] = {}
        for name, role in exp.roles.items():
            for node in role.nodes:
                roles.setdefault(place[node], set()).add(name)
        out.append(roles)
    return out


def _pd_pair(exp: Experiment, a: str, b: str) -> bool:
    """Whether nodes `a` and `b` are the prefill and the decode node of one server set."""
    pair = {PD_ROLES[0], PD_ROLES[1]}
    for roles in pool_roles(exp):
        ra, rb = roles.get(a, set()), roles.get(b, set())
        if len(ra) == len(rb) == 1 and ra | rb == pair:
            return True
    return False


def _check_gpu_overlaps(exp: Experiment) -> None:
    """No GPU of a host is two nodes' (a node without gpu_ids on a sliced host has GPUs
    0..gpus_per_node-1), except the prefill and the decode node of one PD server set with
    the same GPUs (PD on one GPU; their memory shares: _check_shared_memory)."""
    cluster = exp.cluster
    for (_, index), nodes in cluster.shared_gpus().items():
        first, other = nodes[0], nodes[-1]
        implicit = [n for n in (first, other) if n not in cluster.gpu_ids]
        count = cluster.gpus_per_node
        own = "GPU 0" if count == 1 else f"GPUs 0-{count - 1}"
        note = "".join(f" (node {n} has no gpu_ids entry: {own} of its host)" for n in implicit)
        where = f"cluster.gpu_ids.{other}: GPU {index} is also node {first}'s on one host{note}"
        if len(nodes) > 2:
            raise ValueError(
                f"{where}, and node {nodes[1]}'s; at most a PD set's prefill and decode node "
                f"share a GPU"
            )
        if not _pd_pair(exp, first, other):
            raise ValueError(
                f"{where}; only the prefill and the decode node of one PD server set may share GPUs"
            )
        mine, theirs = cluster.host_gpus(other), cluster.host_gpus(first)
        if sorted(mine) != sorted(theirs):
            raise ValueError(
                f"{where}; a prefill and a decode node share GPUs only as the same set "
                f"({theirs} and {mine} differ)"
            )


def _mem_key(exp: Experiment, role: str, axes: dict[str, Any]) -> str:
    """The config key a role's mem_fraction_static comes from."""
    if "mem_fraction_static" in axes:
        return "matrix.server.mem_fraction_static"
    if "mem_fraction_static" in exp.roles[role].server:
        return f"roles.{role}.server.mem_fraction_static"
    return "server.mem_fraction_static"


def _check_shared_memory(exp: Experiment, axes: dict[str, Any]) -> None:
    """Prefill and decode on the same GPU: each role's mem_fraction_static is its share of the
    GPU's memory, given, and together at most MAX_SHARED_MEM_FRACTION (SGLang's default
    would take about 0.9 of the GPU for each process)."""
    shared = exp.cluster.shared_gpus()
    if not shared:
        return
    (_, index), nodes = next(iter(shared.items()))
    where = f"GPU {index} of one host (cluster.gpu_ids: {', '.join(nodes)})"
    suffix = f" (with {axes})" if axes else ""
    share = {
        r.name: validated(ServerArgs, r.base, axes, f"roles.{r.name}").mem_fraction_static
        for r in role_layouts(exp)
    }
    keys = {role: _mem_key(exp, role, axes) for role in PD_ROLES}
    unset = [role for role in PD_ROLES if share[role] is None]
    if unset:
        key = (
            f"roles.{unset[0]}.server.mem_fraction_static"
            if len(unset) == 1
            else "server.mem_fraction_static"
        )
        raise ValueError(
            f"{key}: unset for {' and '.join(unset)}, but prefill and decode share {where}; "
            f"give each role its share, together at most {MAX_SHARED_MEM_FRACTION} (SGLang's "
            f"default takes about 0.9 of the GPU for each process){suffix}"
        )
    p, d = share["prefill"], share["decode"]
    if round(p + d, 9) > MAX_SHARED_MEM_FRACTION:
        raise ValueError(
            f"{keys['decode']}: prefill {p:g} ({keys['prefill']}) + decode {d:g} "
            f"({keys['decode']}) = {p + d:g} is more than {MAX_SHARED_MEM_FRACTION} of {where} "
            f"that both roles' processes share{suffix}"
        )


def start_waves(
    cluster: ClusterConfig, roles: Sequence[tuple[str, Sequence[str]]], *, router: str | None
) -> list[tuple[str, ...]]:
    """The order a server set's roles start in, wave by wave, each wave ready before the next:
    engines on disjoint GPUs start together; engines that share a GPU start one after another
    (two processes profiling one GPU's free memory at once would race); `router`, when the set
    has one, after every engine."""
    engines = tuple(name for name, _ in roles)
    waves = [(name,) for name in engines] if gpu_shared_by(cluster, roles) else [engines]
    return waves + ([(router,)] if router else [])


def gpu_shared_by(cluster: ClusterConfig, roles: Sequence[tuple[str, Sequence[str]]]) -> str:
    """The roles of a server set (`roles`: name and nodes) whose processes share a GPU, as
    `prefill+decode` (results.csv `gpu_shared_by`: that GPU's figures are counted once and
    cannot be split between them); "" when no GPU is shared."""
    found: list[str] = []
    for nodes in cluster.shared_gpus().values():
        held = [name for name, on in roles if set(on) & set(nodes)]
        if len(held) > 1:
            found += held
    return "+".join(name for name, _ in roles if name in found)


def dry_fire_enabled(exp: Experiment) -> bool:
    """Whether a dummy-weight dry fire precedes each real start (`preflight.dry_fire`; unset:
    for PD and multi-node server sets, whose rendezvous, transfer and routing fail late)."""
    if exp.preflight.dry_fire is not None:
        return exp.preflight.dry_fire
    return bool(exp.roles) or any(len(layout.nodes) > 1 for layout in role_layouts(exp))
