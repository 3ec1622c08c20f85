"""Issue 20: two node pools against one, same matrix, repeats and time scale, on the sim.

Runs `snakemake --cores K all` twice from fresh directories on the 2-pool local experiment
(config/experiments/moe_prefill_gate_local_2pools.yaml): once with one pool (`cluster.pools`
= its first four nodes, the same server-set size), once with `pools: auto` (two pools). Prints
wall(2 pools) / wall(1 pool) (goal <= 0.55), the same ratio over the cell phase only (first
cell-start to last cell-done: the part pools can run at once; image check, preflight and the
analysis jobs are not), the starts per server config (each exactly once), and the two node
checks: orchestrator.log (pools.node_overlaps) and the labels on the nodes sampled during the
run (pools.label_overlaps). Also the CPU seconds of each run's process tree (snakemake, its
jobs and clients; not the detached servers) over its wall time: the cores it kept busy. On a
shared 2-core host a run that already keeps the CPU busy cannot get faster with a second pool;
`--time-scale` (both runs) makes cells last longer in simulated server time, as on a GPU
cluster where a cell waits on the GPUs, not on the workflow host.

    python benchmarks/pools.py [--cores 2] [--config FILE] [--time-scale S] [--repeats N] [--smoke]

Checks (exit 1, each failure named): sanity, cells ran in both runs, each server config started
exactly once, no node held two server sets; goal (a timing), wall ratio <= 0.55. `--smoke` (2
server configs of 2 nodes, 1 repeat, 8 requests per cell, up to the cells) enforces the sanity
bounds and reports the ratio without failing on it.
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import os
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from _common import (
    REPO,
    Check,
    add_common_args,
    check_rows,
    log,
    scratch_dir,
    setup_logging,
    snakemake_exe,
    verdict,
    workflow_env,
    write_result,
)

from servesweep.cluster.owner import KIND_LABEL, RUN_LABEL, SERVER_KIND
from servesweep.cluster.pools import label_overlaps, node_overlaps
from servesweep.cluster.runtime import ProcessRuntime
from servesweep.cluster.transport import LocalTransport
from servesweep.core.events import read_events

GOAL_RATIO = 0.55
CONFIG = REPO / "config" / "experiments" / "moe_prefill_gate_local_2pools.yaml"
SAMPLE_S = 2.0
# --smoke: one repeat, 2 server configs (one per pool), one client config, 8 requests per cell,
# no simulated start-up (2 cells per run); server sets of 2 nodes on the first 4 nodes (TP16: half
# the sim processes a start launches); each run up to its cells (`--until run_cell`).
# The node checks and starts are enforced; the wall ratio is a timing: reported, not enforced.
SMOKE_MATRIX_CLIENT = {"concurrency": [8]}
SMOKE_REQUESTS = 8


def stamp(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class LabelWatch(threading.Thread):
    """Samples the labels of this run's server processes on this machine (every sim node
    lives here) and keeps every sample in which a node carried two server sets."""

    def __init__(self, run_id: str) -> None:
        super().__init__(daemon=True)
        self.runtime = ProcessRuntime(LocalTransport())
        self.labels = {KIND_LABEL: SERVER_KIND, RUN_LABEL: run_id}
        self.samples = 0
        self.max_sets = 0
        self.overlaps: list[str] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            found = self.runtime.labelled("local", self.labels)
            self.samples += 1
            sets = {(f.labels.get("pool"), f.labels.get("fingerprint")) for f in found}
            self.max_sets = max(self.max_sets, len(sets))
            self.overlaps += label_overlaps(found)
            self.done.wait(SAMPLE_S)


def one_run(
    *, tmp: Path, name: str, raw: dict[str, Any], cores: int, cells_only: bool = False
) -> dict[str, Any]:
    """One fresh `snakemake --cores N all`; its wall time and what orchestrator.log says.
    `cells_only` (--smoke): up to the cells (`--until run_cell`), without the analysis jobs
    that every check here ignores."""
    workdir = tmp / name
    workdir.mkdir()
    config = workdir / "experiment.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    argv = [snakemake_exe(), "-s", str(REPO / "Snakefile"), "-d", str(workdir)]
    argv += ["--configfile", str(config), "--cores", str(cores), "all"]
    argv += ["--until", "run_cell"] if cells_only else []
    log.info("%s: %s", name, " ".join(argv))
    watch = LabelWatch(raw["run_id"])
    watch.start()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    with open(workdir / "snakemake.log", "w") as fh:
        res = subprocess.run(argv, env=workflow_env(), stdout=fh, stderr=subprocess.STDOUT)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    watch.done.set()
    watch.join()
    if res.returncode != 0:
        tail = (workdir / "snakemake.log").read_text()[-3000:]
        raise SystemExit(f"{name}: snakemake exited {res.returncode}:\n{tail}")
    events = read_events(workdir / "results" / raw["run_id"] / "orchestrator.log")
    starts = collections.Counter(f["server"] for _, e, f in events if e == "start")
    cells = [stamp(t) for t, e, _ in events if e in ("cell-start", "cell-done")]
    client = sum(float(f["client_seconds"]) for _, e, f in events if e == "cell-done")
    ready = sum(float(f["seconds"]) for _, e, f in events if e == "ready")
    return {
        "wall_s": round(wall, 1),
        "cell_phase_s": round(max(cells) - min(cells), 1),
        "client_s_sum": round(client, 1),
        "ready_s_sum": round(ready, 1),
        "cpu_s": round(cpu, 1),
        "cores_busy": round(cpu / wall, 2),
        "load_avg_1m_after": round(os.getloadavg()[0], 2),
        "starts": dict(starts),
        "pools": sorted({f.get("pool", "0") for _, e, f in events if e == "start"}),
        "log_overlaps": node_overlaps(events),
        "label_samples": watch.samples,
        "label_max_server_sets": watch.max_sets,
        "label_overlaps": watch.overlaps,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(CONFIG), help="a pooled experiment file")
    parser.add_argument("--cores", type=int, default=2, help="snakemake --cores (both runs)")
    parser.add_argument("--time-scale", type=float, help="engine.sim.time_scale (both runs)")
    parser.add_argument("--repeats", type=int, help="repeats (both runs)")
    add_common_args(parser)
    if parser.parse_known_args(argv)[0].smoke:  # smoke: one repeat; a flag given still wins
        parser.set_defaults(repeats=1)
    return parser.parse_args(argv)


def checks(*, runs: dict[str, Any], ratio: float, once: bool, clean: bool) -> list[Check]:
    """The node checks and starts (sanity bounds: enforced always) and the goal (a timing)."""
    return [
        Check(
            "cells ran in both runs",
            all(r["cell_phase_s"] > 0 and r["client_s_sum"] > 0 for r in runs.values()),
            ", ".join(f"{n}: client {r['client_s_sum']} s" for n, r in runs.items()),
        ),
        Check(
            "each server config started exactly once in both runs",
            once,
            "; ".join(f"{n}: {sorted(r['starts'].values())}" for n, r in runs.items()),
        ),
        Check(
            "no node ever held two server sets (log and labels)",
            clean,
            "; ".join(
                f"{n}: log {len(r['log_overlaps'])}, labels {len(r['label_overlaps'])}"
                for n, r in runs.items()
            ),
        ),
        Check(
            f"wall(2 pools) / wall(1 pool) <= {GOAL_RATIO}",
            ratio <= GOAL_RATIO,
            f"{ratio:.2f}",
            timing=True,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    args = parse_args(argv)
    base = yaml.safe_load(Path(args.config).read_text())
    if args.time_scale is not None:
        base["engine"]["sim"]["time_scale"] = args.time_scale
    if args.repeats is not None:
        base["repeats"] = args.repeats
    if args.smoke:
        base["matrix"]["client"] = SMOKE_MATRIX_CLIENT
        base["matrix"]["server"]["chunked_prefill_size"] = [8192]
        base["engine"]["sim"]["startup_s"] = 0
        base["workload"]["num_requests"] = SMOKE_REQUESTS
        base["cluster"] |= {"nodes": base["cluster"]["nodes"][:4], "nodes_per_server": 2}
        gpus = base["cluster"]["gpus_per_node"] * 2
        base["server"] |= {"tp_size": gpus, "ep_size": gpus}
    size = base["cluster"]["nodes_per_server"]
    variants = {
        "1_pool": {"pools": [base["cluster"]["nodes"][:size]]},
        "2_pools": {"pools": "auto"},
    }
    runs = {}
    with scratch_dir("pools", keep=args.keep_tmp) as tmp:
        for name, cluster in variants.items():
            raw = {
                **base,
                "run_id": f"pools-bench-{name}",
                "cluster": {**base["cluster"], **cluster},
            }
            runs[name] = one_run(
                tmp=tmp, name=name, raw=raw, cores=args.cores, cells_only=args.smoke
            )
    one, two = runs["1_pool"], runs["2_pools"]
    ratio = two["wall_s"] / one["wall_s"]
    cell_ratio = two["cell_phase_s"] / one["cell_phase_s"]
    once = all(set(r["starts"].values()) == {1} for r in runs.values())
    clean = not any(r["log_overlaps"] or r["label_overlaps"] for r in runs.values())
    for name, run in runs.items():
        print(
            f"{name}: wall {run['wall_s']:.1f} s, cell phase {run['cell_phase_s']:.1f} s "
            f"(client {run['client_s_sum']:.1f} s + ready {run['ready_s_sum']:.1f} s summed), "
            f"CPU {run['cpu_s']:.1f} s = {run['cores_busy']:.2f} cores busy "
            f"(load {run['load_avg_1m_after']} on {os.cpu_count()} CPUs), "
            f"{sum(run['starts'].values())} starts of {len(run['starts'])} server configs "
            f"(pools {','.join(run['pools'])}), label samples {run['label_samples']} "
            f"(at most {run['label_max_server_sets']} server sets at once), node overlaps: "
            f"log {len(run['log_overlaps'])}, labels {len(run['label_overlaps'])}"
        )
    print(f"wall(2 pools) / wall(1 pool) = {ratio:.2f} (goal <= {GOAL_RATIO})")
    print(f"cell phase(2 pools) / cell phase(1 pool) = {cell_ratio:.2f}")
    print(f"each server config started exactly once in both runs: {once}")
    print(f"no node ever held two server sets (log and labels): {clean}")
    found = checks(runs=runs, ratio=ratio, once=once, clean=clean)
    write_result(
        "pools",
        {
            "checks": check_rows(found, smoke=args.smoke),
            "params": {
                "experiment": args.config,
                "command": f"snakemake --cores {args.cores} all",
                "time_scale": base["engine"]["sim"]["time_scale"],
                "repeats": base["repeats"],
                "smoke": args.smoke,
            },
            "runs": runs,
            "ratio": round(ratio, 3),
            "cell_phase_ratio": round(cell_ratio, 3),
            "goal_ratio": GOAL_RATIO,
            "goal_met": ratio <= GOAL_RATIO,
            "each_config_started_once": once,
            "no_node_shared": clean,
        },
        args.out,
        smoke=args.smoke,
    )
    return verdict(found, smoke=args.smoke)


if __name__ == "__main__":
    sys.exit(main())
