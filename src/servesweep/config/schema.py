"""The experiment file's section models (cluster, runtime, engine, server, client, ...) and
the validation helpers the experiment and loader share."""

from __future__ import annotations

import difflib
import itertools
import json
import math
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from servesweep.core.names import env_name, safe_segment

M = TypeVar("M", bound=BaseModel)


def _compiles(value: str) -> str:
    """A regular expression that compiles (ValueError naming why not)."""
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"bad regular expression: {exc}") from None
    return value


def _env_names(env: dict[str, str]) -> dict[str, str]:
    """Environment variables whose names are names (a key goes into a shell line)."""
    for name in env:
        env_name(name, what="variable")
    return env


def _node_names(nodes: list[str]) -> list[str]:
    """Node names that are single path segments (a node's name names its log file)."""
    return [safe_segment(node, what="node") for node in nodes]


# Environment variables of a server or runtime: names checked (core.names.env_name).
EnvMap = Annotated[dict[str, str], AfterValidator(_env_names)]

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


# A Slurm time limit: minutes, MM:SS, HH:MM:SS or D-HH[:MM[:SS]] (sbatch --time).
SLURM_TIME = r"^([0-9]+|[0-9]+:[0-9]{2}|[0-9]+:[0-9]{2}:[0-9]{2}|[0-9]+-[0-9]+(:[0-9]{2}){0,2})$"
SLURM_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.,-]*$"


def _slurm_flags(flags: list[str]) -> list[str]:
    """Extra salloc flags: each one `--name` or `--name=value` (a value with spaces is one
    word: every flag is shell-quoted whole)."""
    for flag in flags:
        if not re.fullmatch(r"--[A-Za-z][A-Za-z0-9-]*(=.+)?", flag):
            raise ValueError(f"{flag!r} is no `--name` or `--name=value` flag")
        if flag.split("=", 1)[0] in SLURM_OWN_FLAGS:
            raise ValueError(f"{flag!r}: set by servesweep (its own key under cluster.slurm)")
    return flags


# Flags servesweep sets itself on the allocation (what sbatch_flags may not repeat).
SLURM_OWN_FLAGS = (
    "--job-name",
    "--nodes",
    "--nodelist",
    "--partition",
    "--account",
    "--time",
    "--exclusive",
    "--gres",
    "--immediate",
    "--no-shell",
)


class SlurmOptions(Strict):
    """How servesweep asks Slurm for its nodes (cluster.transport slurm): one allocation per
    node pool (`salloc --no-shell`), every server rank a long-lived step of it, every other
    node command a short `srun --overlap` step (docs/slurm.md)."""

    partition: str | None = Field(default=None, pattern=SLURM_NAME)
    account: str | None = Field(default=None, pattern=SLURM_NAME)
    # The allocation's time limit: it must cover the run (`servesweep plan` estimates it).
    time_limit: str = Field(default="04:00:00", pattern=SLURM_TIME)
    exclusive: bool = False  # the pool's nodes for this allocation alone (--exclusive)
    # GPUs per node requested (--gres=gpu:N); None: cluster.gpus_per_node; 0: none asked.
    gpus_per_node: int | None = Field(default=None, ge=0)
    # More salloc flags, each `--name` or `--name=value` (e.g. --qos=high, --constraint=h200).
    sbatch_flags: Annotated[list[str], AfterValidator(_slurm_flags)] = Field(default_factory=list)
    # An allocation not granted within this many seconds is given up (one-line error).
    pending_timeout_s: int = Field(default=300, ge=1)
    # Where `runtime.kind` pyxis/apptainer images are imported once for every node (a
    # directory all nodes see); None: <results root>/.images/slurm on the head.
    image_dir: str | None = None


class ClusterConfig(Strict):
    """The site's nodes; the first node of a server set is rank 0 and runs the client. Node
    pools (servesweep.cluster.pools): disjoint node sets, each running one server config at a
    time."""

    transport: Literal["local", "ssh", "slurm"] = "local"
    nodes: Annotated[list[str], AfterValidator(_node_names)] = Field(min_length=1)
    addresses: dict[str, str] = Field(default_factory=dict)
    # transport ssh: the nodes that are this machine (the workflow runs on one of the nodes,
    # as seed 003 runs from 601): their commands run here through /bin/sh, no SSH; the others
    # are reached over SSH. Other nodes reach one at its `addresses` entry (else its name).
    local_nodes: list[str] = Field(default_factory=list)
    gpus_per_node: int = Field(default=8, ge=1)
    ssh: SshOptions = SshOptions()
    slurm: SlurmOptions = SlurmOptions()
    # Nodes one server set needs (default: every node; PD: its roles' and router's nodes).
    nodes_per_server: int | None = Field(default=None, ge=1)
    # None: one pool. auto: as many disjoint sets as fit. Or the sets, each a list of nodes.
    pools: Literal["auto"] | list[list[str]] | None = None
    # The network interface the ranks talk over (GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME of
    # every rank; a multi-NIC node that guesses wrong hangs at start until ready_timeout_s).
    # None: NCCL and Gloo pick one. `servesweep doctor` lists each node's interfaces.
    socket_ifname: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.:-]+$")
    # A node that is a slice of its host (prefill and decode on one machine's GPUs, the
    # multi-GPU rehearsal): the host's GPU indices its servers see (CUDA_VISIBLE_DEVICES) and
    # the only ones its telemetry and preflight count. A node not named here has every GPU
    # its host shows; on a host some node has a slice of, that is GPUs 0..gpus_per_node-1.
    # The prefill and decode nodes of a PD server set may have the same GPUs (PD on one GPU);
    # which overlaps are allowed is the experiment's check (config.experiment).
    gpu_ids: dict[str, list[Annotated[int, Field(ge=0)]]] = Field(default_factory=dict)

    @property
    def local(self) -> bool:
        """The nodes are this machine (no SSH): loopback addresses, auto ports allowed."""
        return self.transport == "local"

    @model_validator(mode="after")
    def _check_nodes(self) -> ClusterConfig:
        dupes = sorted({n for n in self.nodes if self.nodes.count(n) > 1})
        if dupes:
            raise ValueError(f"nodes: duplicate node(s) {dupes}")
        unknown = sorted(set(self.addresses) - set(self.nodes))
        if unknown:
            raise ValueError(f"addresses: given for nodes not in cluster.nodes: {unknown}")
        unknown = sorted(set(self.local_nodes) - set(self.nodes))
        if unknown:
            raise ValueError(f"local_nodes: not in cluster.nodes: {unknown}")
        if self.local_nodes and self.transport != "ssh":
            raise ValueError(
                f"local_nodes: mixes this machine with SSH nodes: needs transport ssh "
                f"(got {self.transport})"
            )
        self._check_gpu_ids()
        if self.nodes_per_server is not None and self.nodes_per_server > len(self.nodes):
            raise ValueError(
                f"nodes_per_server: {self.nodes_per_server} is more than the "
                f"{len(self.nodes)} nodes of cluster.nodes"
            )
        return self

    def _check_gpu_ids(self) -> None:
        if self.gpu_ids and self.transport == "slurm":
            raise ValueError(
                "gpu_ids: not with transport slurm (Slurm binds each step's GPUs, "
                "slurm.gpus_per_node asks for them); remove cluster.gpu_ids"
            )
        unknown = sorted(set(self.gpu_ids) - set(self.nodes))
        if unknown:
            raise ValueError(f"gpu_ids: given for nodes not in cluster.nodes: {unknown}")
        for node, ids in self.gpu_ids.items():
            if len(ids) != self.gpus_per_node or len(set(ids)) != len(ids):
                raise ValueError(
                    f"gpu_ids.{node}: {ids} must be {self.gpus_per_node} distinct GPU indices "
                    f"(cluster.gpus_per_node)"
                )

    def visible_gpus(self, node: str) -> list[int] | None:
        """The host GPU indices `node` has, or None: every GPU it shows (a host nobody slices).
        On a host some node has a slice of, a node without an entry has 0..gpus_per_node-1
        (host_gpus), as the overlap check counts it, never every GPU of the host."""
        if node in self.gpu_ids or any(self.host(n) == self.host(node) for n in self.gpu_ids):
            return self.host_gpus(node)
        return None

    def host(self, node: str) -> str:
        """The machine `node` is on: this one for every node of the local transport ("");
        over ssh and Slurm its address (`cluster.addresses`, else its name)."""
        return "" if self.local else self.addresses.get(node, node)

    def host_gpus(self, node: str) -> list[int]:
        """The host GPU indices `node` has: its gpu_ids, else 0..gpus_per_node-1."""
        return list(self.gpu_ids.get(node) or range(self.gpus_per_node))

    def gpu_holders(self) -> dict[tuple[str, int], list[str]]:
        """(host, GPU index) -> the nodes that have that GPU, in cluster.nodes order, on every
        host some node has a slice of (`gpu_ids`); a host nobody slices is one node's own."""
        sliced = {self.host(node) for node in self.gpu_ids}
        holders: dict[tuple[str, int], list[str]] = {}
        for node in self.nodes:
            if self.host(node) in sliced:
                for index in self.host_gpus(node):
                    holders.setdefault((self.host(node), index), []).append(node)
        return holders

    def shared_gpus(self) -> dict[tuple[str, int], list[str]]:
        """gpu_holders of the GPUs more than one node has (PD on one GPU)."""
        return {gpu: nodes for gpu, nodes in self.gpu_holders().items() if len(nodes) > 1}

    def gpu_sharers(self, node: str) -> list[str]:
        """`node` and every node that has one of its GPUs, in cluster.nodes order."""
        holders = self.gpu_holders()
        found = {n for i in self.host_gpus(node) for n in holders.get((self.host(node), i), [node])}
        return [n for n in self.nodes if n in found | {node}]

    def telemetry_gpus(self, node: str) -> list[int] | None:
        """The host GPU indices whose rows `node`'s snapshots and samples keep (None: every
        GPU it shows): its own, less those an earlier node of cluster.nodes has too. A GPU
        shared by nodes is read once, under its first node; [] when every GPU of `node` is
        an earlier node's."""
        holders = self.gpu_holders()
        host = self.host(node)
        if not any(h == host for h, _ in holders):
            return self.visible_gpus(node)
        return [i for i in self.host_gpus(node) if holders[(host, i)][0] == node]


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


class ImageContract(Strict):
    """What the built image may differ in from the image it is built FROM (seed 000: the same
    dependency set, exactly two SGLang source files, the same SGLang tree). build_images
    records the difference (packages, SGLang files with hashes) and fails on a breach."""

    # The image compared against: default runtime.build.base.image, else the last FROM of
    # runtime.build.dockerfile (read on the node).
    base: str | None = None
    # Distributions the base has whose version may differ (e.g. flashinfer-python: seed 000's
    # patched wheel 0.6.1 -> 0.6.1+sm120mxfp4); removing one stays a breach.
    packages_may_change: list[str] = Field(default_factory=list)
    # Distributions the base lacks that the image may add (e.g. mooncake-transfer-engine:
    # seed 003's Mooncake). Any other added, removed or changed distribution is a breach
    # (sgl-kernel included). Names compare normalized (PEP 503: `Flashinfer_Python` is
    # flashinfer-python).
    packages_may_be_added: list[str] = Field(default_factory=list)
    # Exactly this many files under the sglang package differ (added, removed or changed);
    # null: any number (recorded only).
    sglang_files_changed: int | None = Field(default=None, ge=0)
    same_sglang_tree: bool = True  # the sglang package stays where the base has it


class ImageBuild(Strict):
    """How `build_images` gets the image onto every node (paths are on the nodes)."""

    dockerfile: str | None = None
    context: str | None = None
    build_args: dict[str, str] = Field(default_factory=dict)
    pull: bool = False
    base: BaseImage | None = None
    contract: ImageContract | None = None

    @model_validator(mode="after")
    def _check(self) -> ImageBuild:
        if self.dockerfile and self.pull:
            raise ValueError("give either dockerfile (+ context) or pull: true, not both")
        if self.dockerfile and not self.context:
            raise ValueError("runtime.build.context is required with a dockerfile")
        return self


class CompileCacheConfig(Strict):
    """A per-node folder for the JIT caches of SGLang's kernels (Triton, TorchInductor,
    FlashInfer, DeepGEMM, CUDA's PTX cache) that outlives a container: one subfolder per image
    (per SGLang version for the process runtime), mounted into every server container, private
    to its owner (0700). `servesweep down --purge-caches` removes this config's subfolder."""

    enabled: bool = True
    # An absolute folder on every node; None: `/tmp/servesweep-<owner>/compile-cache`.
    base: str | None = Field(default=None, pattern=r"^/[A-Za-z0-9._+-]+(/[A-Za-z0-9._+-]+)*$")

    @field_validator("base")
    @classmethod
    def _no_dots(cls, value: str | None) -> str | None:
        if value is not None and any(part in (".", "..") for part in value.split("/")):
            raise ValueError(f"{value!r}: no '.' or '..' segments")
        return value


class RuntimeConfig(Strict):
    """How a server process lives on a node: a local process group or a docker container; on
    Slurm (cluster.transport slurm) a step running a process, a pyxis container
    (`srun --container-image`) or `apptainer exec --nv`."""

    kind: Literal["process", "docker", "pyxis", "apptainer"] = "process"
    image: str | None = None
    sudo: bool = False
    gpus: str | None = "all"
    shm_size: str = "32g"
    privileged: bool = False
    devices: list[str] = Field(default_factory=list)
    ulimits: list[str] = Field(default_factory=list)
    mounts: list[str] = Field(default_factory=list)
    env: EnvMap = Field(default_factory=dict)
    build: ImageBuild | None = None
    smoke: list[str] = Field(default_factory=list)  # commands that must exit 0 in the image
    # build_images runs each MoE runner the run chooses once on a node's GPU: SGLang's
    # bench_one_batch on dummy weights of the model cut to this many layers (enough to reach an
    # MoE layer: DeepSeek-style models keep their first layers dense); null: not run.
    moe_smoke_layers: int | None = Field(default=None, ge=1)
    checks: list[ImageCheck] = Field(default_factory=list)
    # pyxis/apptainer: the image reference imported once into `image` (a path every node sees),
    # under a lock: `enroot import -o <image> <source>` / `apptainer pull <image> <source>`.
    # None: `image` is used as it is.
    source: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/@#+-]*$")
    compile_cache: CompileCacheConfig = CompileCacheConfig()

    @property
    def containers(self) -> bool:
        """Servers and clients run in docker containers of `image` (else plain processes)."""
        return self.kind == "docker"

    @property
    def slurm_container(self) -> bool:
        """Servers and clients run in a container of a Slurm step (pyxis or apptainer)."""
        return self.kind in ("pyxis", "apptainer")

    @property
    def imaged(self) -> bool:
        """Servers run from an image (docker, pyxis, apptainer): its SGLang and its mounts,
        not the node's Python and paths."""
        return self.containers or self.slurm_container

    @model_validator(mode="after")
    def _check_image(self) -> RuntimeConfig:
        if self.imaged and not self.image:
            raise ValueError(f"image: required when runtime.kind is {self.kind}")
        if self.source is not None and not self.slurm_container:
            raise ValueError("source: only for runtime.kind pyxis or apptainer (docker: build)")
        if self.slurm_container and self.build is not None:
            raise ValueError(
                f"build: a docker build; runtime.kind {self.kind} imports `source` into `image`"
            )
        if self.source is not None and not (self.image or "").startswith("/"):
            raise ValueError(f"image: {self.image!r}: with source, an absolute path to import into")
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
    # Before the real start, the same topology with dummy weights and one layer per pipeline
    # stage answers one request (through the router for PD): proves rendezvous, KV transfer
    # and routing in about a warm start's time. None: on for multi-node and PD configs.
    dry_fire: bool | None = None


class SimFaults(Strict):
    """Faults the simulated engine injects (for tests and rehearsals)."""

    fail_start: bool = False
    fail_start_nodes: list[str] = Field(default_factory=list)  # fail_start on these nodes only
    # Crash in the batch of request #crash_after (0-based arrival order, as http_500_at).
    crash_after: int | None = Field(default=None, ge=0)
    # How that crash shows: the scheduler's traceback, another process's crash
    # header (the detokenizer's), or a native library's fatal signal (UCX `Caught signal 11`).
    crash_kind: Literal["scheduler", "detokenizer", "native"] = "scheduler"
    # The PD router: after this many requests every worker's circuit is open (503, Rust line).
    router_no_workers_after: int | None = Field(default=None, ge=0)
    http_500_at: list[int] = Field(default_factory=list)
    midstream_error_at: list[int] = Field(default_factory=list)
    hang_at: list[int] = Field(default_factory=list)
    # Wrong answers at full speed (the equivalence probe must catch them): every server config
    # whose moe_runner_backend is listed, and, with corrupt_transfer, every PD decode server
    # (a KV transfer that hands decode the wrong cache).
    corrupt_runners: list[str] = Field(default_factory=list)
    corrupt_transfer: bool = False
    # A dead KV transfer on every PD prefill server: each request's KV never reaches decode
    # (decode logs SGLang's "Failed to get kvcache from prefill instance" and aborts it).
    fail_transfer: bool = False


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
    # `--cuda-graph-max-bs-decode` (`--cuda-graph-max-bs` before SGLang 0.5.14): the largest
    # decode batch captured as a CUDA graph. "auto": the largest concurrency this server config
    # serves (its cells and warm-up; config.matrix resolves it); None: SGLang's default.
    cuda_graph_max_bs: Annotated[int, Field(ge=1)] | Literal["auto"] | None = None
    extra_args: list[str] = Field(default_factory=list)
    env: EnvMap = Field(default_factory=dict)

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

    nodes: Annotated[list[str], AfterValidator(_node_names)] = Field(min_length=1)
    # "auto": a free port at start (local transport only), as engine.port; None: engine's
    port: Port | Literal["auto"] | None = None
    dist_init_port: Port | Literal["auto"] | None = None
    server: dict[str, Any] = Field(default_factory=dict)


class RouterConfig(Strict):
    """The PD router (SGLang's mini load balancer) in front of prefill and decode."""

    node: str
    port: Port | Literal["auto"] = 31000  # "auto": a free port at start (local transport only)
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
    """When a cell's client counts as saturated (not the server's figures): the builtin's
    self-check with event-loop lag p99 or CPU above these; bench_serving (no self-check) with
    its whole-process CPU at or above `cpu_pct`; `invalid` fails such a cell."""

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


class EquivalenceConfig(Strict):
    """The output-equivalence probe per server config (docs/equivalence.md): after warm-up and
    before its cells, a fixed seeded prompt set with greedy decoding and top-k logprobs."""

    enabled: bool = True
    # Prompt lengths (tokens) besides the matrix's own input lengths, which are always probed.
    lengths: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [16, 256])
    prompts_per_length: int = Field(default=2, ge=1, le=64)
    output_len: int = Field(default=16, ge=1, le=4096)
    top_logprobs: int = Field(default=5, ge=1, le=20)
    seed: int = 0
    # Prompt token ids are drawn from [low, high): high at most the model's vocabulary size.
    token_ids: tuple[Annotated[int, Field(ge=0)], Annotated[int, Field(ge=1)]] = (100, 32000)
    # The largest logprob difference on the baseline's tokens (same context) that is still
    # numerical noise, and the top-1 margin under which a greedy flip is a near-tie. Calibrated
    # on real pairs (docs/rehearsal/equivalence-*/): see docs/equivalence.md.
    logprob_tolerance: float = Field(default=0.25, gt=0)
    request_timeout_s: float = Field(default=300.0, gt=0)

    @model_validator(mode="after")
    def _check_range(self) -> EquivalenceConfig:
        low, high = self.token_ids
        if low >= high:
            raise ValueError(f"token_ids: [{low}, {high}) is empty")
        return self


METRICS_MIN_INTERVAL_S = 0.05


class TelemetryConfig(Strict):
    """GPU sampling during a cell (docs/architecture.md, GPU telemetry)."""

    gpu_interval_ms: int = Field(default=1000, ge=20, le=60000)
    # Every server rank's /metrics during a cell (metrics/<server>/<client>/r<k>.jsonl.gz);
    # 0 records none (the file then holds its header only).
    metrics_interval_s: float = Field(default=0.5, ge=0, le=60)

    @field_validator("metrics_interval_s")
    @classmethod
    def _scrape_not_too_often(cls, value: float) -> float:
        if 0 < value < METRICS_MIN_INTERVAL_S:
            raise ValueError(
                f"telemetry.metrics_interval_s {value:g}: 0 (off) or at least "
                f"{METRICS_MIN_INTERVAL_S:g} s (each scrape reads every rank's /metrics)"
            )
        return value


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
    """A validated table to compare the case table against (servesweep.analysis.reference)."""

    file: str  # relative to the checkout, e.g. config/reference/seed003_pd_standard.yaml
    tolerance: float = Field(default=0.10, gt=0)  # relative; a larger delta is marked


class Bound(Strict):
    """An absolute bound on one metric: its value must be >= min and <= max (either may be
    left out, not both)."""

    min: float | None = None
    max: float | None = None

    @model_validator(mode="after")
    def _check_bound(self) -> Bound:
        if self.min is None and self.max is None:
            raise ValueError("a bound needs min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}")
        return self


class GateRule(Strict):
    """Absolute bounds the cells `where` selects must meet (a miss fails the run): `where`
    maps an axis (`case` for a case run) to its value, {} for every cell; `bounds` maps a
    summary.json metric to its Bound, checked against the cell's median over repeats."""

    where: dict[str, Any] = Field(default_factory=dict)
    bounds: dict[str, Bound] = Field(min_length=1)


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
                    what = "server argument" if side == "server" else "workload field"
                    known = [f for f in model.model_fields if f not in ("extra_args", "env")]
                    raise ValueError(
                        f"matrix.{side}.{name}: not a {what}{did_you_mean(name, known)}"
                    )
                if not values:
                    raise ValueError(f"matrix.{side}.{name}: empty axis")
                if len({json.dumps(v) for v in values}) != len(values):
                    raise ValueError(f"matrix.{side}.{name}: duplicate values {values}")
                for value in values:  # `name~value` is part of a folder name (the cell's id)
                    try:
                        safe_segment(f"{name}~{value}", what="cell id part")
                    except ValueError as exc:
                        raise ValueError(f"matrix.{side}.{name}: {exc}") from None
        return self


def combinations(axes: Mapping[str, list[Any]]) -> list[dict[str, Any]]:
    names = list(axes)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*axes.values())]


def validated(model: type[M], base: M, axes: dict[str, Any], where: str) -> M:
    try:
        return model.model_validate({**base.model_dump(), **axes})
    except ValidationError as exc:
        key, msg = error_key(exc)
        suffix = f" (with {axes})" if axes else ""
        text = f"{where}.{key}: {msg}{suffix}" if key else f"{where}: {msg}{suffix}"
        raise ValueError(text) from None


# A validator message that starts with the dotted key it is about: "nodes: duplicate ...".
KEYED = re.compile(r"^([A-Za-z_][\w.\-]*): (.*)$", re.S)


def did_you_mean(name: str, known: Sequence[str]) -> str:
    """` (did you mean 'x'?)` for the closest of `known` to a misspelt `name`, else ""."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _models_in(annotation: Any) -> list[Any]:
    """The annotations one level inside `annotation` that a location part can lead into."""
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _models_in(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [t for a in typing.get_args(annotation) for t in _models_in(a)]
    return [annotation]


def keys_at(root: type[BaseModel], loc: Sequence[str | int]) -> list[str]:
    """The keys a config may hold where `loc` (pydantic's location of an unknown key) points:
    the field names of the model(s) there; [] where none is known."""
    current: list[Any] = _models_in(root)
    for part in loc[:-1]:
        found: list[Any] = []
        for t in current:
            if isinstance(t, type) and issubclass(t, BaseModel):
                field = t.model_fields.get(str(part))
                if field is not None:
                    found += _models_in(field.annotation)
            elif typing.get_origin(t) in (dict, Mapping, list, tuple):
                args = typing.get_args(t)
                if args:
                    found += _models_in(args[-1] if typing.get_origin(t) is not tuple else args[0])
        current = found
    return [
        name
        for t in current
        if isinstance(t, type) and issubclass(t, BaseModel)
        for name in t.model_fields
    ]


def error_key(exc: ValidationError, root: type[BaseModel] | None = None) -> tuple[str, str]:
    """(dotted key, message) of the first error: pydantic's location, extended by the key a
    model validator names at the start of its message. With the `root` model an unknown key
    gets the closest known key as a hint."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        hint = did_you_mean(str(err["loc"][-1]), keys_at(root, err["loc"])) if root else ""
        return loc, f"unknown key{hint}"
    match = KEYED.match(msg) if err["type"] == "value_error" else None
    if match:
        key, msg = match.groups()
        if loc and key != loc and not key.startswith(loc + "."):
            key = f"{loc}.{key}"
        return key, msg
    return loc, msg
