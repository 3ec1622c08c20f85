"""Matrix expansion: server, client and cell-repeat specs, their ids, seeds and fingerprints."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from servesweep.config.experiment import Experiment, role_layouts
from servesweep.config.schema import RouterConfig, ServerArgs, Workload, combinations


def segment(axes: Mapping[str, Any], empty: str) -> str:
    """A server or client id as the workflow writes it: `name~value,...` (`empty` without
    axes); also the ids an imported run gets (analysis.importer)."""
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
    pool: int = 0  # the node pool it runs in (servesweep.cluster.pools)


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


def probe_priority(server: ServerSpec, *, repeats: int, clients: int) -> int:
    """Snakemake priority of a server config's equivalence probe: above every cell of that
    config (CellRepeat.priority's slot of a repeat 0), below every cell of the config before it,
    so the probe runs right after the start and warm-up, and no config starts twice."""
    return (server.priority * (repeats + 1) + repeats + 1) * (clients + 1)


# The identity split (docs/identity.md): these fields say how a server set is reached or
# supervised, not what it measures, so they stay out of fingerprints and cell params. Changing
# one of them (a port, an address, a timeout) reruns nothing.
REACH_ENGINE_FIELDS = frozenset({"port", "dist_init_port", "ready_timeout_s"})
# The compile cache speeds a start up; the kernels it holds are the ones the engine compiles.
REACH_RUNTIME_FIELDS = frozenset({"sudo", "compile_cache"})
REACH_SERVER_ARG_FIELDS = frozenset({"disaggregation_bootstrap_port"})
REACH_ROUTER_FIELDS = frozenset({"port"})
REACH_WORKLOAD_FIELDS = frozenset({"request_timeout_s"})


def derived_seed(base: int, name: str) -> int:
    """A seed for `name` (a cell-repeat, a warm-up) from the configured `workload.seed`:
    stable across runs, machines and Python versions (a hash, not `hash()`)."""
    digest = hashlib.sha256(f"{base}:{name}".encode()).hexdigest()
    return int(digest[:8], 16) % (2**31 - 1)


# Launch arguments given only when set: a config without them keeps the fingerprints it had
# before they existed.
WHEN_SET_SERVER_ARG_FIELDS = frozenset({"cuda_graph_max_bs"})


def _fingerprinted(args: ServerArgs) -> dict[str, Any]:
    """A role's arguments as its fingerprint sees them."""
    exclude = set(REACH_SERVER_ARG_FIELDS)
    exclude |= {f for f in WHEN_SET_SERVER_ARG_FIELDS if getattr(args, f) is None}
    return args.model_dump(exclude=exclude)


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
        # Which GPUs of a shared host a node has decides which server a cell may reuse; only
        # given when set, so configs without slices keep their fingerprints.
        "cluster": {
            "gpus_per_node": exp.cluster.gpus_per_node,
            **({"gpu_ids": exp.cluster.gpu_ids} if exp.cluster.gpu_ids else {}),
        },
        "roles": [
            {"name": r.name, "nodes": r.nodes, "args": _fingerprinted(r.args)} for r in roles
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
    data.pop("guesses", None)  # confirming a guess changes no measurement
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


def served_concurrency(exp: Experiment) -> int:
    """The largest number of requests in flight a server config is sent: its cells' (every
    client config or case runs on every server config) and the warm-up's (one at a time)."""
    return max([1, *(c.workload.concurrency for c in client_specs(exp))])


def resolved_args(exp: Experiment, args: ServerArgs) -> ServerArgs:
    """`args` with `cuda_graph_max_bs: auto` resolved (served_concurrency): the launch line
    and the fingerprint carry the number, so two matrices that serve the same largest
    concurrency share their servers."""
    if args.cuda_graph_max_bs != "auto":
        return args
    return args.model_copy(update={"cuda_graph_max_bs": served_concurrency(exp)})


def server_specs(exp: Experiment) -> list[ServerSpec]:
    """Every server config in matrix order; earlier configs get higher priority."""
    combos = combinations(exp.matrix.server)
    layouts = role_layouts(exp)
    specs = []
    for i, axes in enumerate(combos):
        roles = tuple(
            RoleSpec(
                name=layout.name,
                nodes=layout.nodes,
                port=layout.port,
                dist_init_port=layout.dist_init_port,
                args=resolved_args(
                    exp, ServerArgs.model_validate({**layout.base.model_dump(), **axes})
                ),
            )
            for layout in layouts
        )
        axes = canonical_axes(axes, ServerArgs)
        specs.append(
            ServerSpec(
                id=segment(axes, "pd" if exp.roles else "default"),
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
    for i, combo in enumerate(combinations(exp.matrix.client)):
        axes = canonical_axes(combo, Workload)
        workload = Workload.model_validate({**exp.workload.model_dump(), **axes})
        specs.append(
            ClientSpec(
                id=segment(axes, "default"),
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


def image_key(exp: Experiment) -> str:
    """The image's content key: a hash of everything that decides what the image holds and how
    it is checked (tag, build inputs, base, smoke, checks, pinned engine). Evidence under it is
    shared by every run (results/.images/<key>/): a new RUN_ID with the same image builds
    nothing; a changed input is a new key, so the image is built and checked again."""
    payload = {
        "runtime": exp.runtime.model_dump(
            mode="json", include={"kind", "image", "build", "smoke", "checks"}
        ),
        "engine": exp.engine.model_dump(mode="json", include={"kind", "version", "python"}),
    }
    if exp.runtime.source is not None:  # a pyxis/apptainer import (keys of others unchanged)
        payload["source"] = exp.runtime.source
    if exp.runtime.moe_smoke_layers is not None:  # the MoE kernel smoke: runners, layers
        runners = {r.args.moe_runner_backend for s in server_specs(exp) for r in s.roles}
        payload["moe_smoke"] = [exp.runtime.moe_smoke_layers, sorted(filter(None, runners))]
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]
