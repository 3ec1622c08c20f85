"""Typed experiment model: validation, env narrowing, matrix expansion, fingerprints, paths."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

from servesweep.errors import ConfigError

# Env variables that set one matrix axis from a comma-separated list (as in seed 000).
SERVER_AXIS_ENV = {
    "BACKENDS_CSV": "moe_runner_backend",
    "CHUNKED_PREFILL_SIZES_CSV": "chunked_prefill_size",
}
CLIENT_AXIS_ENV = {"CONCURRENCIES_CSV": "concurrency"}
# Env variables that set one shared server argument.
SERVER_ARG_ENV = {"EP_SIZE": "ep_size"}
# Env variables that only select what runs: aggregates still cover every finished cell-repeat
# of the run's configured matrix (config.unnarrowed_env).
NARROWING_ENV = frozenset({*SERVER_AXIS_ENV, *CLIENT_AXIS_ENV, "SUITE"})

M = TypeVar("M", bound=BaseModel)


def _compiles(value: str) -> str:
    """A regular expression that compiles (ValueError naming why not)."""
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"bad regular expression: {exc}") from None
    return value


# A config value that is a regular expression (an image check's `expect`, an evidence pattern).
Regex = Annotated[str, AfterValidator(_compiles)]
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


class Strict(BaseModel):
    """Base model: unknown keys are errors, instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class SshOptions(Strict):
    """How nodes are reached over SSH (paramiko, `~/.ssh/config` aliases)."""

    config_file: str = "~/.ssh/config"
    accept_new_host_keys: bool = False
    connect_timeout_s: float = Field(default=15.0, gt=0)
    command_timeout_s: float = Field(default=600.0, gt=0)
    keepalive_s: int = Field(default=15, ge=0)


class ClusterConfig(Strict):
    """The site's nodes; the first node of a server set is rank 0 and runs the client. Node
    pools (servesweep.pools): disjoint node sets, each running one server config at a time."""

    transport: Literal["local", "ssh"] = "local"
    nodes: list[str] = Field(min_length=1)
    addresses: dict[str, str] = Field(default_factory=dict)
    gpus_per_node: int = Field(default=8, ge=1)
    ssh: SshOptions = SshOptions()
    # Nodes one server set needs (default: every node; PD: its roles' and router's nodes).
    nodes_per_server: int | None = Field(default=None, ge=1)
    # None: one pool. auto: as many disjoint sets as fit. Or the sets, each a list of nodes.
    pools: Literal["auto"] | list[list[str]] | None = None

    @model_validator(mode="after")
    def _check_nodes(self) -> ClusterConfig:
        dupes = sorted({n for n in self.nodes if self.nodes.count(n) > 1})
        if dupes:
            raise ValueError(f"nodes: duplicate node(s) {dupes}")
        unknown = sorted(set(self.addresses) - set(self.nodes))
        if unknown:
            raise ValueError(f"addresses: given for nodes not in cluster.nodes: {unknown}")
        if self.nodes_per_server is not None and self.nodes_per_server > len(self.nodes):
            raise ValueError(
                f"nodes_per_server: {self.nodes_per_server} is more than the "
                f"{len(self.nodes)} nodes of cluster.nodes"
            )
        return self


class BaseImage(Strict):
    """The image a build starts FROM: made present on every node before the build, by its own
    dockerfile or a pull (seed 003's PD image builds on seed 000's phase5 image)."""

    image: str
    dockerfile: str | None = None
    context: str | None = None
    build_args: dict[str, str] = Field(default_factory=dict)
    pull: bool = False

    @model_validator(mode="after")
    def _check(self) -> BaseImage:
        if self.dockerfile and self.pull:
            raise ValueError("give either dockerfile (+ context) or pull: true, not both")
        if self.dockerfile and not self.context:
            raise ValueError("context: required with a dockerfile")
        return self


class ImageCheck(Strict):
    """A check of what the image holds: a command run inside it and a regular expression its
    output must match (searched, multi-line), e.g. a package version or a file present."""

    name: str = Field(pattern=NAME_PATTERN)
    command: str
    expect: Regex


class ImageBuild(Strict):
    """How `build_images` gets the image onto every node (paths are on the nodes)."""

    dockerfile: str | None = None
    context: str | None = None
    build_args: dict[str, str] = Field(default_factory=dict)
    pull: bool = False
    base: BaseImage | None = None

    @model_validator(mode="after")
    def _check(self) -> ImageBuild:
        if self.dockerfile and self.pull:
            raise ValueError("give either dockerfile (+ context) or pull: true, not both")
        if self.dockerfile and not self.context:
            raise ValueError("runtime.build.context is required with a dockerfile")
        return self


class RuntimeConfig(Strict):
    """How a server process lives on a node: a local process group or a docker container."""

    kind: Literal["process", "docker"] = "process"
    image: str | None = None
    sudo: bool = False
    gpus: str | None = "all"
    shm_size: str = "32g"
    privileged: bool = False
    devices: list[str] = Field(default_factory=list)
    ulimits: list[str] = Field(default_factory=list)
    mounts: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    build: ImageBuild | None = None
    smoke: list[str] = Field(default_factory=list)  # commands that must exit 0 in the image
    checks: list[ImageCheck] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check_image(self) -> RuntimeConfig:
        if self.kind == "docker" and not self.image:
            raise ValueError("image: required when runtime.kind is docker")
        names = [c.name for c in self.checks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"checks: duplicate name(s) {dupes}")
        return self


class SecretsConfig(Strict):
    """Where the sudo password comes from when no env variable gives it (never the value)."""

    sudo_password_file: str | None = None  # env SUDO_PASSWORD / SUDO_PASSWORD_FILE win
    passwordless_sudo: bool = False  # the nodes' sudoers need no password for docker


class PreflightConfig(Strict):
    """Thresholds of the checks before any server start."""

    # A GPU with a compute process, or more memory in use than this, is busy (one-line error).
    gpu_idle_max_memory_mib: float = Field(default=1024, ge=0)


class SimFaults(Strict):
    """Faults the simulated engine injects (for tests and rehearsals)."""

    fail_start: bool = False
    fail_start_nodes: list[str] = Field(default_factory=list)  # fail_start on these nodes only
    crash_after: int | None = Field(default=None, ge=0)
    http_500_at: list[int] = Field(default_factory=list)
    midstream_error_at: list[int] = Field(default_factory=list)
    hang_at: list[int] = Field(default_factory=list)


class SimConfig(Strict):
    """Knobs of the simulated engine (engine.kind: sim)."""

    time_scale: float = Field(default=0.02, ge=0)  # 0: no simulated compute at all
    seed: int = 0
    startup_s: float = Field(default=60.0, ge=0)
    profile: str | None = None
    noise: bool = True  # benign log noise, re-tokenization drift, special-token outputs
    faults: SimFaults = SimFaults()


Port = Annotated[int, Field(ge=1, le=65535)]


class EngineConfig(Strict):
    """Which serving engine runs: SGLang itself or our simulator speaking its API."""

    kind: Literal["sim", "sglang"] = "sim"
    version: str = "0.5.23"
    model_path: str
    served_model_name: str | None = None
    # "auto": a free port picked when the server starts (local transport only); recorded in
    # service/current.json, from where clients of later cells reach it.
    port: Port | Literal["auto"] = 30000
    dist_init_port: Port | Literal["auto"] = 20000
    ready_timeout_s: float = Field(default=900.0, gt=0)
    python: str = "python3"
    sim: SimConfig = SimConfig()


class ServerArgs(Strict):
    """`sglang.launch_server` arguments shared by, or varied across, server configs."""

    tp_size: int = Field(default=1, ge=1)
    ep_size: int = Field(default=1, ge=1)
    dp_size: int = Field(default=1, ge=1)
    pp_size: int = Field(default=1, ge=1)
    moe_runner_backend: str | None = None
    chunked_prefill_size: int | None = None
    page_size: int | None = Field(default=None, ge=1)
    kv_cache_dtype: str | None = None
    disable_radix_cache: bool = False
    mem_fraction_static: float | None = Field(default=None, gt=0, le=1)
    max_running_requests: int | None = Field(default=None, ge=1)
    trust_remote_code: bool = True
    disaggregation_transfer_backend: str | None = None
    disaggregation_ib_device: str | None = None
    disaggregation_bootstrap_port: int | None = Field(default=None, ge=1, le=65535)
    speculative_algorithm: str | None = None
    extra_args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_parallel(self) -> ServerArgs:
        if self.tp_size % self.ep_size:
            raise ValueError(f"ep_size: {self.ep_size} does not divide tp_size {self.tp_size}")
        if self.chunked_prefill_size is not None and (
            self.chunked_prefill_size == 0 or self.chunked_prefill_size < -1
        ):
            raise ValueError("chunked_prefill_size: must be positive or -1 (disabled)")
        return self


PD_ROLES = ("prefill", "decode")
SINGLE_ROLE = "server"


class RoleConfig(Strict):
    """One role of a PD server set: its nodes, ports and argument overrides."""

    nodes: list[str] = Field(min_length=1)
    port: int | None = Field(default=None, ge=1, le=65535)
    dist_init_port: int | None = Field(default=None, ge=1, le=65535)
    server: dict[str, Any] = Field(default_factory=dict)


class RouterConfig(Strict):
    """The PD router (SGLang's mini load balancer) in front of prefill and decode."""

    node: str
    port: int = Field(default=31000, ge=1, le=65535)
    policy: Literal["random", "round_robin"] = "random"
    mini_lb: bool = True


class Workload(Strict):
    """What the client sends: varies without a server restart."""

    dataset: Literal["random-ids"] = "random-ids"
    input_len: int = Field(ge=1)
    output_len: int = Field(ge=1)
    num_requests: int = Field(ge=1)
    concurrency: int = Field(default=1, ge=1)
    stream: bool = True
    request_rate: float = Field(default=math.inf, gt=0)
    warmup_requests: int = Field(default=0, ge=0)
    seed: int = 1
    request_timeout_s: float = Field(default=3600.0, gt=0)

    @field_validator("request_rate", mode="before")
    @classmethod
    def _null_rate_is_unlimited(cls, value: Any) -> Any:
        # JSON has no infinity: model_dump_json writes inf as null (the run_cell param).
        return math.inf if value is None else value


class SaturationConfig(Strict):
    """When the builtin client's self-check calls its cell client-saturated (not the server's
    figures): event-loop lag p99 or CPU above these; `invalid` fails such a cell."""

    loop_lag_p99_ms: float = Field(default=5.0, gt=0)
    cpu_pct: float = Field(default=90.0, gt=0)
    invalid: bool = False


class ClientConfig(Strict):
    """Which load generator runs: ours (builtin) or SGLang's bench_serving in the image."""

    kind: Literal["builtin", "bench_serving"] = "builtin"
    tokenizer: str | None = None
    saturation: SaturationConfig = SaturationConfig()


# Default of validation.min_retokenized_ratio (docs/validation.md): healthy published records
# go down to 0.63 (a VLM run), silent failures are at or below 0.0003 (0 of 300,000; 8 of 32,334).
MIN_RETOKENIZED_RATIO = 0.5


class ValidationConfig(Strict):
    """Thresholds that tell a silent failure from re-tokenization drift (docs/validation.md)."""

    min_retokenized_ratio: float = Field(default=MIN_RETOKENIZED_RATIO, ge=0, le=1)
    # Liveness during a cell: the server's counters flat this long, or /health failing, aborts.
    stall_timeout_s: float = Field(default=120.0, gt=0)
    # The server counted more requests during a cell than its client sent: fail the cell (else
    # a warning; the raw record keeps both counts either way).
    foreign_requests_invalid: bool = False


class TelemetryConfig(Strict):
    """GPU sampling during a cell (docs/architecture.md, GPU telemetry)."""

    gpu_interval_ms: int = Field(default=1000, ge=20, le=60000)


class SloConfig(Strict):
    """Service-level objectives per request (any subset); goodput counts requests meeting all."""

    ttft_ms: float | None = Field(default=None, gt=0)
    tpot_ms: float | None = Field(default=None, gt=0)
    e2e_ms: float | None = Field(default=None, gt=0)


class PlotsConfig(Strict):
    """Which summary metrics get a delta plot and a metric-vs-client-axis plot."""

    metrics: list[str] = Field(
        default_factory=lambda: ["ttft_p50_ms", "ttft_p99_ms", "e2e_p50_ms", "input_tps"],
        min_length=1,
    )
    # pool: one metric-vs panel per node pool (a node-set effect), not per second server axis
    facet: Literal["pool"] | None = None


class EvidencePattern(Strict):
    """A log line that proves part of the serving path (e.g. PD's P->D transfer), counted in
    the logs of one role's processes; a cell-repeat with fewer than `min_per_cell` is invalid.

    `window: cell` counts what the role logged while the cell's client ran (a line per
    request); `window: service` counts since the server started (a line SGLang logs once
    per process, via `warning_once`)."""

    pattern: Regex
    role: Literal["server", "prefill", "decode", "router"]
    min_per_cell: int = Field(default=1, ge=0)
    window: Literal["cell", "service"] = "cell"


class ReferenceConfig(Strict):
    """A validated table to compare the case table against (servesweep.reference)."""

    file: str  # relative to the checkout, e.g. config/reference/seed003_pd_standard.yaml
    tolerance: float = Field(default=0.10, gt=0)  # relative; a larger delta is marked


class Matrix(Strict):
    """Axes: lists of values for server arguments (restart) and workload fields (no restart)."""

    server: dict[str, list[Any]] = Field(default_factory=dict)
    client: dict[str, list[Any]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_axes(self) -> Matrix:
        for side, model, axes in (
            ("server", ServerArgs, self.server),
            ("client", Workload, self.client),
        ):
            for name, values in axes.items():
                if name not in model.model_fields or name in ("extra_args", "env"):
                    raise ValueError(f"matrix.{side}.{name}: not a {model.__name__} field")
                if not values:
                    raise ValueError(f"matrix.{side}.{name}: empty axis")
                if len({json.dumps(v) for v in values}) != len(values):
                    raise ValueError(f"matrix.{side}.{name}: duplicate values {values}")
        return self


class Experiment(Strict):
    """One experiment: cluster, runtime, engine, server args, matrix, workload, repeats."""

    run_id: str = Field(pattern=NAME_PATTERN)
    site: str | None = None  # config/site/<site>.yaml under this file (servesweep.site)
    cluster: ClusterConfig
    runtime: RuntimeConfig = RuntimeConfig()
    secrets: SecretsConfig = SecretsConfig()
    preflight: PreflightConfig = PreflightConfig()
    engine: EngineConfig
    client: ClientConfig = ClientConfig()
    validation: ValidationConfig = ValidationConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
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

    @model_validator(mode="after")
    def _check_combinations(self) -> Experiment:
        self._check_roles()
        node_pools(self)
        for axes in _combinations(self.matrix.server):
            for role in role_layouts(self):
                args = _validated(ServerArgs, role.base, axes, "matrix.server")
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
        for axes in _combinations(self.matrix.client):
            _validated(Workload, self.workload, axes, "matrix.client")
        self._check_cases()
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

    def _check_roles(self) -> None:
        auto = "auto" in (self.engine.port, self.engine.dist_init_port)
        if auto and self.cluster.transport != "local":
            raise ValueError("engine.port: 'auto' needs cluster.transport local (give a number)")
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
            _validated(Workload, self.workload, overrides, f"cases.{name}")
        for suite, names in self.suites.items():
            missing = [n for n in names if n not in self.cases]
            if missing or not names:
                raise ValueError(f"suites.{suite}: unknown or no cases {missing}")
        if self.suite is not None and self.suite not in {*self.suites, "all"}:
            raise ValueError(f"suite: {self.suite!r} is not one of {[*self.suites, 'all']}")


# ---------------------------------------------------------------- node pools (servesweep.pools)

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
        base = _validated(ServerArgs, exp.server, role.server, f"roles.{name}.server")
        layouts.append(
            RoleLayout(
                name,
                tuple(role.nodes),
                role.port or port_number(exp.engine.port),
                role.dist_init_port or port_number(exp.engine.dist_init_port),
                base,
            )
        )
    return layouts


def _check_pd_pair(exp: Experiment, axes: dict[str, Any]) -> None:
    """Prefill and decode must agree on what a KV transfer needs (SGLang refuses otherwise)."""
    args = {
        r.name: _validated(ServerArgs, r.base, axes, f"roles.{r.name}") for r in role_layouts(exp)
    }
    for key, what in (("page_size", "KV page size"), ("kv_cache_dtype", "KV cache dtype")):
        p, d = getattr(args["prefill"], key), getattr(args["decode"], key)
        if p != d:
            raise ValueError(
                f"roles.decode.server.{key}: {d!r} differs from prefill's {p!r}; the {what} "
                f"must be equal on P and D (SGLang fails the first transfer: "
                f"'{'Page size' if key == 'page_size' else 'KV cache dtype'} mismatch')"
            )


def _combinations(axes: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    names = list(axes)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*axes.values())]


def _validated(model: type[M], base: M, axes: dict[str, Any], where: str) -> M:
    try:
        return model.model_validate({**base.model_dump(), **axes})
    except ValidationError as exc:
        key, msg = _error_key(exc)
        suffix = f" (with {axes})" if axes else ""
        text = f"{where}.{key}: {msg}{suffix}" if key else f"{where}: {msg}{suffix}"
        raise ValueError(text) from None


# A validator message that starts with the dotted key it is about: "nodes: duplicate ...".
_KEYED = re.compile(r"^([A-Za-z_][\w.\-]*): (.*)$", re.S)


def _error_key(exc: ValidationError) -> tuple[str, str]:
    """(dotted key, message) of the first error: pydantic's location, extended by the key a
    model validator names at the start of its message."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        return loc, "unknown key"
    match = _KEYED.match(msg) if err["type"] == "value_error" else None
    if match:
        key, msg = match.groups()
        if loc and key != loc and not key.startswith(loc + "."):
            key = f"{loc}.{key}"
        return key, msg
    return loc, msg


def _first_error(exc: ValidationError) -> str:
    key, msg = _error_key(exc)
    return f"{key}: {msg}" if key else msg


def _format_error(exc: ValidationError) -> str:
    key, msg = _error_key(exc)
    return f"config key '{key or '<top level>'}': {msg}"


def _csv(value: str, name: str) -> list[str]:
    """The items of an env list; an empty one, or an empty item (`8,,16`), is an error (an
    unset variable, not an empty one, keeps the config's axis)."""
    items = [v.strip() for v in value.split(",")]
    if not any(items):
        raise ConfigError(
            f"env {name}={value!r}: empty list (unset it to keep the config's values)"
        )
    if not all(items):
        raise ConfigError(f"env {name}={value!r}: empty item in the comma-separated list")
    return items


def apply_env(raw: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """Return a copy of the raw config with RUN_ID, EP_SIZE and the *_CSV axes applied."""
    data = json.loads(json.dumps(dict(raw), default=str))
    if env.get("RUN_ID"):
        data["run_id"] = env["RUN_ID"]
    if env.get("SUITE"):
        data["suite"] = env["SUITE"]
    for var, arg in SERVER_ARG_ENV.items():
        if var in env:
            if not env[var].strip():
                raise ConfigError(f"env {var}={env[var]!r}: empty (unset it to keep the config's)")
            data.setdefault("server", {})[arg] = env[var]
    matrix = data.setdefault("matrix", {})
    for side, table in (("server", SERVER_AXIS_ENV), ("client", CLIENT_AXIS_ENV)):
        for var, axis in table.items():
            if var in env:
                matrix.setdefault(side, {})[axis] = _csv(env[var], var)
    return data


def unnarrowed_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` without the variables that narrow what runs (the run's full matrix)."""
    return {k: v for k, v in env.items() if k not in NARROWING_ENV}


def env_var_of(side: str, axis: str, env: Mapping[str, str]) -> str | None:
    """The env variable that set this matrix axis, if one did."""
    table = SERVER_AXIS_ENV if side == "server" else CLIENT_AXIS_ENV
    return next((var for var, name in table.items() if name == axis and var in env), None)


def _coerce_axes(data: dict[str, Any], env: Mapping[str, str]) -> None:
    """Coerce axis values to their field types so '8192' from an env CSV equals 8192; a value
    that is not one names the env variable it came from, if any."""
    matrix = data.get("matrix") or {}
    for side, model in (("server", ServerArgs), ("client", Workload)):
        for name, values in (matrix.get(side) or {}).items():
            field = model.model_fields.get(name)
            if field is None or not isinstance(values, list):
                continue
            adapter = TypeAdapter(field.annotation)
            for value in values:
                try:
                    adapter.validate_python(value)
                except ValidationError as exc:
                    var = env_var_of(side, name, env)
                    key = f"config key 'matrix.{side}.{name}'"
                    if var:
                        key = f"env {var}={env[var]!r}: {key}: {value!r}"
                    raise ConfigError(f"{key}: {_first_error(exc)}") from None
            matrix[side][name] = [adapter.validate_python(v) for v in values]


def load_experiment(
    raw: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    *,
    site_dir: str | Path | None = None,
) -> Experiment:
    """Validate a raw config (e.g. Snakemake's `config`) over its site file (`site:`), after
    env narrowing.

    The baseline must be in the configured matrix; after narrowing it may be absent (then no
    deltas are computed for the missing side).
    """
    env = env or {}
    from servesweep.site import apply_site

    raw = apply_site(raw, site_dir)
    try:
        Experiment.model_validate(raw)
    except ValidationError as exc:
        hint = ""
        if not {"cluster", "engine", "matrix"} & set(raw):
            hint = (
                " (the config holds only overrides: `snakemake --config key=value` replaces the"
                " embedded default, so add --configfile config/config.yaml, or name the run"
                " with RUN_ID=...)"
            )
        raise ConfigError(_format_error(exc) + hint) from None
    data = apply_env(raw, env)
    _coerce_axes(data, env)
    baseline = data.pop("baseline", {}) or {}
    try:
        exp = Experiment.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_error(exc) + " (after env narrowing)") from None
    kept = {
        k: v
        for k, v in baseline.items()
        if v in exp.matrix.server.get(k, exp.matrix.client.get(k, []))
    }
    return exp.model_copy(update={"baseline": kept})


def site_dir_of(path: str | Path) -> Path | None:
    """config/site next to the folder of an experiment file (config/experiments/x.yaml), if
    there is one; else the checkout's (servesweep.site.DEFAULT_SITE_DIR)."""
    candidate = Path(path).resolve().parent.parent / "site"
    return candidate if candidate.is_dir() else None


def load_experiment_file(path: str | Path, env: Mapping[str, str] | None = None) -> Experiment:
    """Read a YAML experiment file and validate it (see `load_experiment`)."""
    return load_experiment(read_config_file(path), env, site_dir=site_dir_of(path))


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A YAML config file's mapping; a missing, unreadable or malformed file is a ConfigError."""
    try:
        with open(path) as fh:
            raw = yaml.safe_load(fh) or {}
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"config file {path}: not valid YAML{where}: {problem}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return raw


# ---------------------------------------------------------------- matrix expansion


def _segment(axes: Mapping[str, Any], empty: str) -> str:
    if not axes:
        return empty
    return ",".join(f"{k}~{_fmt(v)}" for k, v in axes.items())


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


@dataclass(frozen=True)
class RoleSpec:
    """One role of a server set with its resolved launch arguments."""

    name: str
    nodes: tuple[str, ...]
    port: int
    dist_init_port: int
    args: ServerArgs


@dataclass(frozen=True)
class ServerSpec:
    """One server config (a set of roles, plus a router for PD) and its fingerprint."""

    id: str
    axes: dict[str, Any]
    roles: tuple[RoleSpec, ...]
    router: RouterConfig | None
    fingerprint: str
    priority: int
    pool: int = 0  # the node pool it runs in (servesweep.pools)


@dataclass(frozen=True)
class ClientSpec:
    """One client config: the workload sent to a running server."""

    id: str
    axes: dict[str, Any]
    workload: Workload
    index: int = 0  # in config order: cells of a server config run in this order


@dataclass(frozen=True)
class CellRepeat:
    """The unit of work and of files: server config x client config x repeat."""

    server: ServerSpec
    client: ClientSpec
    repeat: int
    repeats: int = 1  # of the experiment: the priority interleaves repeats
    clients: int = 1  # client configs of the experiment: the priority keeps their order

    @property
    def key(self) -> str:
        return f"{self.server.id}/{self.client.id}/r{self.repeat}"

    @property
    def seed(self) -> int:
        """The prompts' seed: derived from the client id and repeat (docs/identity.md), so
        every case and repeat sends its own prompts and every server config the same ones."""
        return derived_seed(self.client.workload.seed, f"{self.client.id}/r{self.repeat}")

    @property
    def workload(self) -> Workload:
        """The client's workload with this cell-repeat's seed: what the client sends."""
        return self.client.workload.model_copy(update={"seed": self.seed})

    @property
    def priority(self) -> int:
        """Snakemake priority: every cell of a server config above the next config's (one
        start per config), within it repeat 1 of every client cell before repeat 2, ...
        (interleaved against drift, as AIPerf's REPEATED mode), and within a repeat the client
        configs in config order (a suite's smoke case first)."""
        base = self.server.priority * (self.repeats + 1) + self.repeats + 1 - self.repeat
        return base * (self.clients + 1) + self.clients - self.client.index


# The identity split (docs/identity.md): these fields say how a server set is reached or
# supervised, not what it measures, so they stay out of fingerprints and cell params. Changing
# one of them (a port, an address, a timeout) reruns nothing.
REACH_ENGINE_FIELDS = frozenset({"port", "dist_init_port", "ready_timeout_s"})
REACH_RUNTIME_FIELDS = frozenset({"sudo"})
REACH_SERVER_ARG_FIELDS = frozenset({"disaggregation_bootstrap_port"})
REACH_ROUTER_FIELDS = frozenset({"port"})
REACH_WORKLOAD_FIELDS = frozenset({"request_timeout_s"})


def derived_seed(base: int, name: str) -> int:
    """A seed for `name` (a cell-repeat, a warm-up) from the configured `workload.seed`:
    stable across runs, machines and Python versions (a hash, not `hash()`)."""
    digest = hashlib.sha256(f"{base}:{name}".encode()).hexdigest()
    return int(digest[:8], 16) % (2**31 - 1)


def fingerprint(exp: Experiment, roles: tuple[RoleSpec, ...]) -> str:
    """Short hash of exactly what defines the measurement of a server set: image, engine and
    its version, model, topology, launch flags; not ports, addresses, labels or timeouts."""
    payload = {
        # Injected faults are a rehearsal knob, not a server property: removing one must not
        # rerun the cells that finished (nor change the sim's noise stream).
        "engine": exp.engine.model_dump(
            exclude={**dict.fromkeys(REACH_ENGINE_FIELDS, True), "sim": {"faults"}}
        ),
        "runtime": exp.runtime.model_dump(exclude=set(REACH_RUNTIME_FIELDS)),
        "cluster": {"gpus_per_node": exp.cluster.gpus_per_node},
        "roles": [
            {
                "name": r.name,
                "nodes": r.nodes,
                "args": r.args.model_dump(exclude=set(REACH_SERVER_ARG_FIELDS)),
            }
            for r in roles
        ],
        "router": exp.router.model_dump(exclude=set(REACH_ROUTER_FIELDS)) if exp.router else None,
    }
    blob = json.dumps(payload, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def workload_key(workload: Workload) -> str:
    """The measured part of a workload as JSON (a cell's `params`; timeouts left out)."""
    return workload.model_dump_json(exclude=set(REACH_WORKLOAD_FIELDS))


def measured_config(exp: Experiment) -> str:
    """The experiment as JSON without the reach fields (the manifest's rerun trigger)."""
    data = exp.model_dump(mode="json")
    for key in REACH_ENGINE_FIELDS:
        data["engine"].pop(key, None)
    for key in REACH_RUNTIME_FIELDS:
        data["runtime"].pop(key, None)
    data["cluster"].pop("addresses", None)
    data["cluster"].pop("ssh", None)
    for args in [data["server"], *(r["server"] for r in data["roles"].values())]:
        for key in REACH_SERVER_ARG_FIELDS:
            args.pop(key, None)
    for role in data["roles"].values():
        role.pop("port", None)
        role.pop("dist_init_port", None)
    if data["router"]:
        for key in REACH_ROUTER_FIELDS:
            data["router"].pop(key, None)
    for workload in [data["workload"], *data["cases"].values()]:
        for key in REACH_WORKLOAD_FIELDS:
            workload.pop(key, None)
    return json.dumps(data, sort_keys=True)


def canonical_axes(axes: Mapping[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    """Axes in the model's field order, whatever the YAML order: ids never depend on it."""
    order = list(model.model_fields)
    return {k: axes[k] for k in sorted(axes, key=order.index)}


def server_specs(exp: Experiment) -> list[ServerSpec]:
    """Every server config in matrix order; earlier configs get higher priority."""
    combos = _combinations(exp.matrix.server)
    layouts = role_layouts(exp)
    specs = []
    for i, axes in enumerate(combos):
        roles = tuple(
            RoleSpec(
                name=layout.name,
                nodes=layout.nodes,
                port=layout.port,
                dist_init_port=layout.dist_init_port,
                args=ServerArgs.model_validate({**layout.base.model_dump(), **axes}),
            )
            for layout in layouts
        )
        axes = canonical_axes(axes, ServerArgs)
        specs.append(
            ServerSpec(
                id=_segment(axes, "pd" if exp.roles else "default"),
                axes=axes,
                roles=roles,
                router=exp.router,
                fingerprint=fingerprint(exp, roles),
                priority=len(combos) - i,
            )
        )
    return specs


def selected_cases(exp: Experiment) -> list[str]:
    """Case names of the selected suite (all cases when no suite or suite 'all')."""
    if exp.suite is None or exp.suite == "all":
        return list(exp.cases)
    return list(exp.suites[exp.suite])


def client_specs(exp: Experiment) -> list[ClientSpec]:
    """Every client config: the selected cases, or the client-axis combinations."""
    if exp.cases:
        return [
            ClientSpec(
                id=f"case~{name}",
                axes={"case": name},
                workload=Workload.model_validate({**exp.workload.model_dump(), **exp.cases[name]}),
                index=i,
            )
            for i, name in enumerate(selected_cases(exp))
        ]
    specs = []
    for i, combo in enumerate(_combinations(exp.matrix.client)):
        axes = canonical_axes(combo, Workload)
        workload = Workload.model_validate({**exp.workload.model_dump(), **axes})
        specs.append(
            ClientSpec(
                id=_segment(axes, "default"),
                axes={k: getattr(workload, k) for k in axes},
                workload=workload,
                index=i,
            )
        )
    return specs


def cell_repeats(exp: Experiment) -> list[CellRepeat]:
    """Every cell-repeat, grouped by server config (the order servers are started in)."""
    clients = client_specs(exp)
    return [
        CellRepeat(server=s, client=c, repeat=r, repeats=exp.repeats, clients=len(clients))
        for s in server_specs(exp)
        for c in clients
        for r in range(1, exp.repeats + 1)
    ]


def axis_names(exp: Experiment) -> tuple[list[str], list[str]]:
    """(server axes, client axes) as columns of results.csv, in the canonical order of the
    ids (whatever the YAML order); cases form one axis `case`."""
    server = list(canonical_axes(exp.matrix.server, ServerArgs))
    client = ["case"] if exp.cases else list(canonical_axes(exp.matrix.client, Workload))
    return server, client


def json_schema() -> dict[str, Any]:
    """JSON Schema of an experiment file, generated from the typed models."""
    return Experiment.model_json_schema()
