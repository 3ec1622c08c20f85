"""Two node pools on the sim: a fault in one pool with --keep-going, reruns in their own pool."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
import yaml

from servesweep.cluster.pools import node_overlaps
from servesweep.core.events import read_events
from tests.helpers import REPO, deep_update, run_snakemake, two_configs_one_cell

pytestmark = pytest.mark.workflow

TWO_POOLS = REPO / "config" / "experiments" / "moe_prefill_gate_local_2pools.yaml"
RUN_ID = "wf-pools"
# The first two runs up to results.csv (the pools run the cells; the analysis after it has no
# pool); the last one `all`, whose targets are every cell of the matrix (results.csv alone reads
# the cells that have their files: a deleted one is no input of it).
TABLE = f"results/{RUN_ID}/results.csv"


def _config(tmp_path: Path, faults: dict) -> Path:
    raw = deep_update(
        yaml.safe_load(TWO_POOLS.read_text()),
        {
            "run_id": RUN_ID,
            "engine": {"sim": {"time_scale": 0.001, "startup_s": 5, "faults": faults}},
            **two_configs_one_cell(),
            "repeats": 2,
        },
    )
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _new_events(log: Path, seen: int) -> list[tuple[str, str, dict[str, str]]]:
    return read_events(log)[seen:]


def test_a_failed_pool_lets_the_other_finish_and_reruns_in_its_own_pool(tmp_path: Path) -> None:
    run_dir = tmp_path / "results" / RUN_ID
    log = run_dir / "orchestrator.log"
    # pool 1's node s605 fails every server start (sim fault; not part of any fingerprint)
    cfg = _config(tmp_path, {"fail_start_nodes": ["s605"]})
    proc = run_snakemake(tmp_path, "--cores", "2", "--keep-going", TABLE, "--configfile", str(cfg))
    assert proc.returncode != 0
    pools = yaml.safe_load((run_dir / "pools.json").read_text())["servers"]
    by_pool = collections.defaultdict(list)
    for server, where in pools.items():
        by_pool[where["pool"]].append(server)
    assert sorted(by_pool) == [0, 1] and all(len(v) == 1 for v in by_pool.values())
    good, bad = by_pool[0][0], by_pool[1][0]
    # pool 0's cells all finished; pool 1's are missing, listed with why
    assert len(list((run_dir / "raw" / good).rglob("*.jsonl"))) == 2
    assert not (run_dir / "raw" / bad).exists()
    missing = (run_dir / "missing.txt").read_text()
    assert missing.startswith("missing cells: 2 of 4 (pool 1: 2)"), missing
    assert "missing cells: 2 of 4 (pool 1: 2)" in proc.stderr
    assert f"{bad}/concurrency~4/r1 (pool 1): " in missing
    assert "not ready" in missing or "exited" in missing
    events = read_events(log)
    starts = [(f["server"], f["pool"]) for _, e, f in events if e == "start"]
    fired = sorted(f["server"] for _, e, f in events if e == "dry-fire")
    # Multi-node server sets dry-fire before their start (preflight.dry_fire): pool 1 tried
    # its server once (its equivalence probe, the config's first job), its dry fire failed,
    # and its cells did not start after the failure; pool 0 fired, then started
    assert fired == sorted([good, bad])
    assert starts == [(good, "0")]
    assert [e for _, e, _ in events].count("cell-skipped") == 2
    assert "after its equivalence probe failed" in missing
    assert node_overlaps(events) == []

    # The fault gone: only pool 1's missing cells run, in pool 1, with one start.
    seen = len(events)
    cfg = _config(tmp_path, {})
    proc = run_snakemake(tmp_path, "--cores", "2", TABLE, "--configfile", str(cfg))
    assert proc.returncode == 0, proc.stderr[-3000:]
    new = _new_events(log, seen)
    assert [(f["server"], f["pool"], f["nodes"]) for _, e, f in new if e == "start"] == [
        (bad, "1", "s605,s606,s607,s608")
    ]
    assert sorted(f["cell"] for _, e, f in new if e == "cell-done") == [
        f"{bad}/concurrency~4/r1",
        f"{bad}/concurrency~4/r2",
    ]
    results = (run_dir / "results.csv").read_text().splitlines()
    assert "pool" in results[0].split(",") and len(results) == 5

    # A deleted raw file of pool 0 reruns that cell in pool 0, with one start.
    seen = len(read_events(log))
    (run_dir / "raw" / good / "concurrency~4" / "r2.jsonl").unlink()
    proc = run_snakemake(tmp_path, "--cores", "2", "all", "--configfile", str(cfg))
    assert proc.returncode == 0, proc.stderr[-3000:]
    new = _new_events(log, seen)
    assert [(f["server"], f["pool"]) for _, e, f in new if e == "start"] == [(good, "0")]
    assert [f["cell"] for _, e, f in new if e == "cell-done"] == [f"{good}/concurrency~4/r2"]
    assert node_overlaps(read_events(log)) == []
