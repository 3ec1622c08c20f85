"""The workflow's jobs that reach the cluster: image checks, preflight, one cell-repeat.

Each is one rule's job: keyword arguments in, files out. `scripts/<rule>.py` map the rule's
`snakemake.input/output/params/log/wildcards` onto them inside logsetup.job_logging (the rule's
log). `config` is the workflow's config as Snakemake holds it; each job resolves it as the
Snakefile does (env narrowing included). The analysis jobs are in analysisjobs and plotjobs,
so that a cell's process imports neither pandas nor seaborn.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from servesweep.cluster import pools
from servesweep.cluster.images import build_images as build_all
from servesweep.config.matrix import CellRepeat, client_specs, server_specs, workload_key
from servesweep.core.errors import ConfigError, PoolStopped
from servesweep.core.files import write_json_atomic, write_text_atomic
from servesweep.measure import provenance
from servesweep.measure.cells import check_prerequisites
from servesweep.measure.cells import run_cell as run_cell_repeat
from servesweep.measure.locks import cell_lock, server_lock
from servesweep.measure.probe import probe_key, run_probe
from servesweep.serving.engines import launch_targets
from servesweep.serving.preflight import run_preflight
from servesweep.serving.servers import connect
from servesweep.workflow import progress
from servesweep.workflow.jobconfig import PathLike, experiment  # noqa: F401 (re-exported)
from servesweep.workflow.logsetup import console


def build_images(
    *, config: Mapping[str, Any], logs: Sequence[PathLike], out: Sequence[PathLike]
) -> None:
    """Rule build_images: on every node at once, base image, image, smoke, every launch command
    parsed by the image's own engine parser, and content checks; one evidence file per node
    (`out`, in cluster.nodes order, beside its log in `logs`)."""
    exp, paths = experiment(config)
    node_logs = {node: Path(log) for node, log in zip(exp.cluster.nodes, logs, strict=True)}
    with connect(exp, paths) as manager:
        evidence = build_all(
            exp=exp,
            runtime=manager.runtime,
            logs=node_logs,
            owner=manager.owner,
            launches=launch_targets(exp),
        )
    for node, path in zip(exp.cluster.nodes, out, strict=True):
        write_json_atomic(path, evidence[node])


def preflight(*, config: Mapping[str, Any], out: PathLike) -> None:
    """Rule preflight: checks before any server start, as evidence."""
    exp, paths = experiment(config)
    with connect(exp, paths) as manager:
        evidence = run_preflight(exp=exp, manager=manager)
    write_json_atomic(out, evidence)


def run_cell(
    *,
    config: Mapping[str, Any],
    server: str,
    client: str,
    repeat: int,
    fingerprint: str,
    workload: str,
    measured_with: str,
    raw: PathLike,
    gpu: PathLike,
    bench_log: PathLike,
    metrics: PathLike | None = None,
) -> None:
    """Rule run_cell: one cell-repeat, given by its wildcards (server, client, repeat) and
    params (the fingerprint its server must have, its workload as JSON)."""
    exp, paths = experiment(config)
    specs = [s for s in server_specs(exp) if s.id == server]
    if not specs:
        raise ConfigError(
            f"cell {server}/{client}/r{repeat}: no server {server} in run {exp.run_id}"
        )
    multi_pool = len(pools.node_pools(exp)) > 1
    try:
        exp, spec = pools.locate(exp, server_id=server, fingerprint=fingerprint)
    except ConfigError:
        raise ConfigError(
            f"cell {server}/{client}/r{repeat}: the config gives server {server} fingerprint "
            f"{specs[0].fingerprint}, the workflow planned {fingerprint}"
        ) from None
    all_clients = client_specs(exp)
    clients = [c for c in all_clients if c.id == client]
    cell = (
        CellRepeat(
            server=spec,
            client=clients[0],
            repeat=int(repeat),
            repeats=exp.repeats,
            clients=len(all_clients),
        )
        if clients
        else None
    )
    if cell is None or workload_key(cell.workload) != workload:
        raise ConfigError(
            f"cell {server}/{client}/r{repeat}: the config's workload of client {client} is not "
            f"the one the workflow planned ({workload})"
        )
    planned, now = json.loads(measured_with), provenance.measured_with(exp, cell)
    if planned != now:
        diff = ", ".join(provenance.differences(planned, now))
        raise ConfigError(f"cell {cell.key}: the workflow planned it with other settings: {diff}")
    check_prerequisites(exp=exp, paths=paths, cell=cell.key)
    stopped = paths.pool_stopped(spec.pool)
    holder = f"{exp.run_id} {os.getpid()}"
    with (
        cell_lock(paths.cell_lock(cell), cell=cell.key),
        server_lock(paths.node_locks(exp.cluster.nodes), cell=cell.key, holder=holder),
        connect(exp, paths, pool=spec.pool) as manager,
    ):
        if Path(raw).exists():  # another live job of this cell measured it while this one waited
            manager.events.emit("cell-done-elsewhere", cell=cell.key)
            return
        if stopped.exists():
            manager.events.emit("cell-skipped", cell=cell.key, pool=spec.pool)
            raise PoolStopped(
                f"cell {cell.key}: not started: pool {spec.pool} stopped after a failure "
                f"({stopped.read_text().strip()})"
            )
        try:
            run_cell_repeat(
                exp=exp,
                cell=cell,
                manager=manager,
                raw=Path(raw),
                gpu=Path(gpu),
                bench_log=Path(bench_log),
                metrics=Path(metrics) if metrics else None,
            )
        except BaseException as exc:
            if multi_pool:
                stop_pool(stopped, f"cell {cell.key}", exc)
            raise
    line = progress.finished_line(path=paths.progress, cell=cell.key, raw=raw)
    if line:
        console(line)


def probe_outputs(
    *, config: Mapping[str, Any], server: str, fingerprint: str, probe: str, out: PathLike
) -> None:
    """Rule probe_outputs: the equivalence probe of one server config (measure.probe), after
    its warm-up and before its cells (priority), into equivalence/<server>.json. Not a cell:
    nothing it sends is measured, and it takes the node locks a cell takes."""
    exp, paths = experiment(config)
    multi_pool = len(pools.node_pools(exp)) > 1
    try:
        exp, spec = pools.locate(exp, server_id=server, fingerprint=fingerprint)
    except ConfigError:
        raise ConfigError(
            f"equivalence probe of server {server}: the config gives it another fingerprint "
            f"than the workflow planned ({fingerprint})"
        ) from None
    if probe != probe_key(exp):
        raise ConfigError(
            f"equivalence probe of server {server}: the config's probe is {probe_key(exp)}, "
            f"the workflow planned {probe}"
        )
    tag = f"{server}/probe"
    check_prerequisites(exp=exp, paths=paths, cell=tag)
    stopped = paths.pool_stopped(spec.pool)
    holder = f"{exp.run_id} {os.getpid()}"
    with (
        server_lock(paths.node_locks(exp.cluster.nodes), cell=tag, holder=holder),
        connect(exp, paths, pool=spec.pool) as manager,
    ):
        if stopped.exists():
            raise PoolStopped(
                f"{tag}: not started: pool {spec.pool} stopped after a failure "
                f"({stopped.read_text().strip()})"
            )
        try:
            answers = run_probe(exp=exp, spec=spec, manager=manager)
        except BaseException as exc:
            manager.events.emit(
                "probe-failed", server=server, fp=fingerprint, error=first_line(exc)
            )
            if multi_pool:
                stop_pool(stopped, tag, exc)
            raise
    write_json_atomic(out, answers.to_dict())


def stop_pool(marker: Path, what: str, exc: BaseException) -> None:
    """A failure in one pool of several: the pool's other jobs are skipped (PoolStopped), the
    other pools go on; the marker names what failed and its first line."""
    write_text_atomic(marker, f"{what} failed: {first_line(exc)}\n")


def first_line(exc: BaseException) -> str:
    """An error's first line (its type when it has no text), at most 300 characters."""
    return (str(exc).splitlines() or [type(exc).__name__])[0][:300]
