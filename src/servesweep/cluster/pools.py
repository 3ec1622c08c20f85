"""Node pools: disjoint node sets of a site, each running one server config at a time.

The experiment's topology (its single role's first `cluster.nodes_per_server` nodes, or its PD
roles' and router's nodes) is the template. A pool is a node set of the template's size, read
position by position: a PD pool is a pair of prefill and decode sets. Each server config is
assigned to one pool at planning time (`assign`); a pool's cells see the experiment narrowed to
the pool's nodes (`narrow`), with its own ports. Each pool is one Snakemake resource.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from servesweep.cluster.owner import POOL_LABEL, RUN_LABEL
from servesweep.cluster.runtime import Labelled
from servesweep.config.experiment import Experiment, Pool, node_pools, template_nodes
from servesweep.config.matrix import CellRepeat, ServerSpec, client_specs, server_specs
from servesweep.config.paths import RunPaths
from servesweep.core.errors import ConfigError
from servesweep.core.events import read_events
from servesweep.core.files import write_json_atomic

# Fixed ports of pool i are the configured ones + i * PORT_STRIDE (pools may share a host).
PORT_STRIDE = 100
DEFAULT_BOOTSTRAP_PORT = 8998  # SGLang's --disaggregation-bootstrap-port default


def narrow(exp: Experiment, pool: Pool) -> Experiment:
    """The experiment as one server set of `pool` sees it: its nodes in the template's places,
    fixed ports shifted by pool.index * PORT_STRIDE. Without `cluster.pools`: `exp` itself."""
    if exp.cluster.pools is None:
        return exp
    mapping = dict(zip(template_nodes(exp), pool.nodes, strict=True))
    offset = pool.index * PORT_STRIDE

    def port(value: Any) -> Any:
        return value + offset if isinstance(value, int) else value

    data = exp.model_dump()
    cluster = data["cluster"]
    cluster["nodes"] = [mapping[n] for n in exp.cluster.nodes if n in mapping]
    cluster["addresses"] = {n: a for n, a in exp.cluster.addresses.items() if n in pool.nodes}
    cluster["pools"] = cluster["nodes_per_server"] = None
    for key in ("port", "dist_init_port"):
        data["engine"][key] = port(data["engine"][key])
    for role in data["roles"].values():
        role["nodes"] = [mapping[n] for n in role["nodes"]]
        role["port"], role["dist_init_port"] = port(role["port"]), port(role["dist_init_port"])
        if "disaggregation_bootstrap_port" in role["server"]:
            role["server"]["disaggregation_bootstrap_port"] += offset
    if data["router"] is not None:
        data["router"]["node"] = mapping[data["router"]["node"]]
        data["router"]["port"] += offset
    if exp.roles:
        bootstrap = data["server"]["disaggregation_bootstrap_port"] or DEFAULT_BOOTSTRAP_PORT
        data["server"]["disaggregation_bootstrap_port"] = bootstrap + offset
    try:
        return Experiment.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(
            f"config key 'cluster.pools': pool {pool.index} ({', '.join(pool.nodes)}): "
            f"{where}: {first['msg']}"
        ) from None


@dataclass(frozen=True)
class PoolPlan:
    """Which pool each server config runs in, and the estimated work that balanced it."""

    pools: tuple[Pool, ...]
    assignment: dict[str, int]  # server id -> pool index, in matrix order
    estimates: dict[str, float]  # server id -> estimated seconds (empty with one pool)

    def servers(self, index: int) -> list[str]:
        return [s for s, p in self.assignment.items() if p == index]

    def to_dict(self) -> dict[str, Any]:
        """pools.json and the manifest's `pools` (no estimates: they change with history)."""
        return {
            "pools": [
                {"pool": p.index, "nodes": list(p.nodes), "servers": self.servers(p.index)}
                for p in self.pools
            ],
            "servers": {
                s: {"pool": i, "nodes": list(self.pools[i].nodes)}
                for s, i in self.assignment.items()
            },
        }


def assign(
    *,
    server_ids: Sequence[str],
    pools: Sequence[Pool],
    estimates: Mapping[str, float],
    previous: Mapping[str, Sequence[str]],
) -> dict[str, int]:
    """Each server config to one pool. A config keeps the node set it had (`previous`, e.g. a
    smaller matrix's pools.json); the others go, longest estimate first, to the pool with the
    least estimated work so far (ties: the lower index)."""
    index_of = {p.nodes: p.index for p in pools}
    out: dict[str, int] = {}
    load = [0.0] * len(pools)
    for sid in server_ids:
        kept = index_of.get(tuple(previous.get(sid, ())))
        if kept is not None:
            out[sid] = kept
            load[kept] += estimates.get(sid, 0.0)
    order = {sid: i for i, sid in enumerate(server_ids)}
    new = sorted(
        (s for s in server_ids if s not in out), key=lambda s: (-estimates.get(s, 0.0), order[s])
    )
    for sid in new:
        best = min(range(len(pools)), key=lambda j: (load[j], j))
        out[sid] = best
        load[best] += estimates.get(sid, 0.0)
    return {sid: out[sid] for sid in server_ids}


def read_previous(path: Path) -> dict[str, list[str]]:
    """Server id -> node set from an earlier plan's pools.json ({} if none or unreadable)."""
    try:
        servers = json.loads(path.read_text())["servers"]
        return {sid: list(v["nodes"]) for sid, v in servers.items()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def write_plan(path: Path, plan: PoolPlan) -> None:
    """Persist the assignment (workflow onstart): later plans keep it (`assign`)."""
    data = plan.to_dict()
    try:
        if json.loads(path.read_text()) == data:
            return
    except (OSError, ValueError):
        pass
    write_json_atomic(path, data)


def pooled_specs(exp: Experiment, plan: PoolPlan) -> list[ServerSpec]:
    """Every server config in matrix order, as its pool runs it (nodes, ports, fingerprint)."""
    if exp.cluster.pools is None:
        return server_specs(exp)
    per_pool = [server_specs(narrow(exp, p)) for p in plan.pools]
    out = []
    for i, spec in enumerate(per_pool[0]):
        index = plan.assignment[spec.id]
        out.append(dataclasses.replace(per_pool[index][i], pool=index))
    return out


def pooled_cells(exp: Experiment, plan: PoolPlan) -> list[CellRepeat]:
    """Every cell-repeat (config.cell_repeats) with its server config as its pool runs it."""
    clients = client_specs(exp)
    return [
        CellRepeat(server=s, client=c, repeat=r, repeats=exp.repeats, clients=len(clients))
        for s in pooled_specs(exp, plan)
        for c in clients
        for r in range(1, exp.repeats + 1)
    ]


def locate(exp: Experiment, *, server_id: str, fingerprint: str) -> tuple[Experiment, ServerSpec]:
    """The narrowed experiment and spec of the pool whose server `server_id` has `fingerprint`
    (a cell's params): a job needs no pools.json to know its pool."""
    for pool in node_pools(exp):
        narrowed = narrow(exp, pool)
        for spec in server_specs(narrowed):
            if spec.id == server_id and spec.fingerprint == fingerprint:
                return narrowed, dataclasses.replace(spec, pool=pool.index)
    raise ConfigError(
        f"server {server_id}: no pool of run {exp.run_id} gives it fingerprint {fingerprint} "
        f"(the config changed since the workflow planned it)"
    )


def _uses(wildcards: Any, *, index: int, pool_of: Callable[[Any], int]) -> int:
    return int(pool_of(wildcards) == index)


def cell_resources(plan: PoolPlan, pool_of: Callable[[Any], int]) -> dict[str, Any]:
    """run_cell's resources: 1 of its own pool's resource, 0 of the others' (`pool_of`: the
    pool index of a job's wildcards). One pool: a constant (a callable costs Snakemake time
    per job, about 1 s per 10k cells of a dry-run)."""
    if len(plan.pools) == 1:
        return {plan.pools[0].resource: 1}
    return {
        p.resource: functools.partial(_uses, index=p.index, pool_of=pool_of) for p in plan.pools
    }


def every_pool(plan: PoolPlan) -> dict[str, int]:
    """Resources of a job that needs every node (image checks, preflight): no cell meanwhile."""
    return {p.resource: 1 for p in plan.pools}


def missing_cells(cells: Sequence[CellRepeat], paths: RunPaths) -> list[tuple[CellRepeat, str]]:
    """Cells without a raw file, each with why: its last cell-failed or cell-skipped event of
    orchestrator.log (a skipped cell whose server's equivalence probe failed says so), else
    "not run"."""
    why: dict[str, str] = {}
    probe_failed: dict[str, str] = {}
    for _, event, fields in read_events(paths.orchestrator_log):
        if event == "probe-failed":
            probe_failed[fields.get("server", "")] = fields.get("error", "failed")
        elif event == "cell-failed":
            why[fields.get("cell", "")] = fields.get("error", "failed")
        elif event == "cell-skipped":
            cell = fields.get("cell", "")
            probe = probe_failed.get(cell.split("/", 1)[0])
            after = f" after its equivalence probe failed: {probe}" if probe else ""
            why[cell] = f"not started: pool {fields.get('pool')} stopped{after}"
        elif event == "cell-done":
            why.pop(fields.get("cell", ""), None)
    return [(c, why.get(c.key, "not run")) for c in cells if not paths.raw(c).exists()]


def missing_report(cells: Sequence[CellRepeat], paths: RunPaths) -> str:
    """The missing cells per pool and why (workflow onerror; written to missing.txt); "" when
    no cell failed (e.g. the run stopped before any cell: its own error says why)."""
    missing = missing_cells(cells, paths)
    if all(reason == "not run" for _, reason in missing):
        return ""
    per_pool: dict[int, int] = {}
    for cell, _ in missing:
        per_pool[cell.server.pool] = per_pool.get(cell.server.pool, 0) + 1
    counts = ", ".join(f"pool {p}: {n}" for p, n in sorted(per_pool.items()))
    lines = [f"missing cells: {len(missing)} of {len(cells)} ({counts})"]
    lines += [f"  {c.key} (pool {c.server.pool}): {reason}" for c, reason in missing]
    return "\n".join(lines) + "\n"


def node_overlaps(events: Sequence[tuple[str, str, Mapping[str, str]]]) -> list[str]:
    """From orchestrator.log's events: every start that put a server set on a node another set
    still held (started, its stop not yet logged); [] when no node ever held two."""
    held: dict[tuple[str, str], tuple[str, ...]] = {}  # (pool, fp) -> nodes
    found = []
    for stamp, event, fields in sorted(events, key=lambda e: e[0]):
        key = (fields.get("pool", "0"), fields.get("fp", ""))
        if event == "start":
            nodes = tuple(fields.get("nodes", "").split(","))
            for other, other_nodes in held.items():
                shared = sorted(set(nodes) & set(other_nodes))
                if shared:
                    found.append(
                        f"{stamp}: server {fields.get('server')} (pool {key[0]}) started on "
                        f"{','.join(shared)} held by fp {other[1]} of pool {other[0]}"
                    )
            held[key] = nodes
        elif event == "stop":
            held.pop(key, None)
    return found


def label_overlaps(found: Sequence[Labelled]) -> list[str]:
    """From the labels of the server processes on the nodes at one moment: every node that
    carries processes of more than one server set (run, pool, fingerprint); [] if none."""
    sets: dict[str, set[tuple[str, str, str]]] = {}
    for item in found:
        node = item.labels.get("node", item.node)
        labels = item.labels
        sets.setdefault(node, set()).add(
            (
                labels.get(RUN_LABEL, "?"),
                labels.get(POOL_LABEL, "0"),
                labels.get("fingerprint", "?"),
            )
        )
    return [
        f"node {node}: {len(held)} server sets: "
        + "; ".join(f"run {r} pool {p} fp {f}" for r, p, f in sorted(held))
        for node, held in sorted(sets.items())
        if len(held) > 1
    ]
